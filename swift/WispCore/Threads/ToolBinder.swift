/// Tool names to the model tools a thread is bound to: the one judgement of a tool name (an
/// unknown one is an error that lists the valid ones, docs/threads.md), for a thread a call
/// creates and a stored thread resumed alike.
struct ToolBinder: Sendable {
    private let catalogue: [String: ModelTool]
    /// The catalogue again, confined to the default roots plus the given ones (a client's roots).
    private let withRoots: (@Sendable ([String]) -> [ModelTool])?

    init(_ tools: [ModelTool], withRoots: (@Sendable ([String]) -> [ModelTool])?) {
        catalogue = Dictionary(tools.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        self.withRoots = withRoots
    }

    /// The catalogue, by name.
    var names: [String] { catalogue.keys.sorted() }

    /// The tools `names` name, each once, confined to `roots` as well as the default roots
    /// when any are given.
    func tools(_ names: [String], roots: [String]) throws(WispError) -> [ModelTool] {
        var tools: [ModelTool] = []
        for name in names {
            guard let tool = catalogue[name] else { throw unknown(name) }
            if !tools.contains(where: { $0.name == name }) { tools.append(tool) }
        }
        guard !tools.isEmpty, !roots.isEmpty, let withRoots else { return tools }
        let wanted = Set(tools.map(\.name))
        return withRoots(roots).filter { wanted.contains($0.name) }
    }

    private func unknown(_ name: String) -> WispError {
        let listed = catalogue.isEmpty
            ? "this wisp has no model tools" : "valid tools: \(names.joined(separator: ", "))"
        return WispError(.invalidArgument, "unknown tool \(name.preview.debugDescription); \(listed)")
    }
}
