/// A tool from wisp's own catalogue that a model may call inside a thread. Backend-neutral:
/// each backend turns these into its own tool form (OpenAI function, FoundationModels `Tool`,
/// the echo backend's `!tool` directive).
public struct ModelTool: Sendable {
    public var name: String
    /// One phrase: every tool's schema takes room in a small context window.
    public var description: String
    /// JSON Schema of the arguments object, as JSON text.
    public var parametersSchema: String
    /// Runs the tool. The argument is the JSON object the model produced, as text.
    /// Throws WispError(.invalidArgument, …) with a message the model can act on.
    public var call: @Sendable (String) async throws -> String

    public init(name: String, description: String, parametersSchema: String,
                call: @escaping @Sendable (String) async throws -> String) {
        self.name = name
        self.description = description
        self.parametersSchema = parametersSchema
        self.call = call
    }
}
