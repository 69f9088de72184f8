// wisp's model tools on Apple's model (AppleBackend.swift says how this folder is checked
// without a Mac).
#if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
import Foundation
import WispInfrastructure
import FoundationModels

/// A wisp `ModelTool` as a FoundationModels tool: arguments arrive as `GeneratedContent`
/// under a schema built from the tool's JSON Schema, and are handed on as JSON text.
@available(macOS 26.0, *)
struct AppleTool: FoundationModels.Tool {
    typealias Arguments = GeneratedContent
    typealias Output = String

    /// Marks an output the model saw in place of a failed call (`ToolExchange.failed`).
    static let failurePrefix = "Tool error: "

    let name: String
    let description: String
    let parameters: GenerationSchema
    private let tool: ModelTool

    init(_ tool: ModelTool) throws(WispError) {
        name = tool.name
        description = tool.description
        self.tool = tool
        do {
            let json = try JSONSerialization.jsonObject(with: Data(tool.parametersSchema.utf8))
            parameters = try GenerationSchema(root: Self.schema(json, name: tool.name), dependencies: [])
        } catch {
            throw WispError(.internal,
                            "tool '\(tool.name)': its parameters schema cannot be given to Apple's model: \(error)")
        }
    }

    /// The subset of JSON Schema wisp's tools use: object, array, string (with enum), integer, number, boolean.
    static func schema(_ json: Any, name: String) -> DynamicGenerationSchema {
        let node = json as? [String: Any] ?? [:]
        let description = node["description"] as? String
        if let choices = node["enum"] as? [String] {
            return DynamicGenerationSchema(name: name, description: description, anyOf: choices)
        }
        switch node["type"] as? String {
        case "object":
            let properties = node["properties"] as? [String: Any] ?? [:]
            let required = Set(node["required"] as? [String] ?? [])
            return DynamicGenerationSchema(name: name, description: description,
                                           properties: properties.keys.sorted().map { key in
                let sub = properties[key] ?? [:]
                return DynamicGenerationSchema.Property(
                    name: key, description: (sub as? [String: Any])?["description"] as? String,
                    schema: schema(sub, name: "\(name)_\(key)"), isOptional: !required.contains(key))
            })
        case "array":
            return DynamicGenerationSchema(arrayOf: schema(node["items"] ?? [:], name: "\(name)_item"),
                                           minimumElements: node["minItems"] as? Int,
                                           maximumElements: node["maxItems"] as? Int)
        case "integer": return DynamicGenerationSchema(type: Int.self)
        case "number": return DynamicGenerationSchema(type: Double.self)
        case "boolean": return DynamicGenerationSchema(type: Bool.self)
        default: return DynamicGenerationSchema(type: String.self)
        }
    }

    /// Schema guides are not always enforced (Apple forum threads 811620, 812501), so the
    /// arguments are checked again here and by the tool itself. A failure goes back to the
    /// model as text, so the turn goes on (a throw would end the whole call).
    @concurrent
    func call(arguments: GeneratedContent) async throws -> String {
        guard case .structure = arguments.kind else {
            return Self.failurePrefix + "the arguments must be a JSON object"
        }
        let result = try await ToolRun.output(tool, arguments.jsonString)
        return result.failed ? Self.failurePrefix + result.text : result.text
    }
}
#endif
