// Structured output on Apple's model: guided generation (AppleBackend.swift says how this
// folder is checked without a Mac).
#if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
import Foundation
import WispInfrastructure
import FoundationModels

/// A `respond` schema (wisp's supported subset, OutputSchema.swift) as a FoundationModels
/// `GenerationSchema`, so the model's decoding is constrained to it. Properties keep their order.
@available(macOS 26.0, *)
enum AppleOutputSchema {
    static func generationSchema(_ schema: OutputSchema) throws(WispError) -> GenerationSchema {
        do {
            return try GenerationSchema(root: node(schema.root, name: "Output"), dependencies: [])
        } catch let error as WispError {
            throw error
        } catch {
            throw WispError(.invalidArgument, "schema: Apple's model cannot take it: \(error)")
        }
    }

    /// `name` is the node's path, so every named node (object, choice) is unique in the schema.
    static func node(_ s: JSONValue, name: String) throws -> DynamicGenerationSchema {
        let description = s["description"]?.string
        if let c = s["const"] { return try constant(c, name: name) }
        if let members = s["enum"]?.array {
            let strings = members.compactMap(\.string)
            if strings.count == members.count {
                return DynamicGenerationSchema(name: name, description: description, anyOf: strings)
            }
            return DynamicGenerationSchema(name: name, description: description,
                                           anyOf: try members.enumerated().map { k, m in
                try constant(m, name: "\(name)_\(k)")
            })
        }
        if let branches = (s["anyOf"] ?? s["oneOf"])?.array {
            return DynamicGenerationSchema(name: name, description: description,
                                           anyOf: try branches.enumerated().map { k, b in
                try node(b, name: "\(name)_\(k)")
            })
        }
        switch s["type"]?.string {
        case "object":
            // Names as code points (UTF-8 bytes): NFC and NFD "café" are two properties.
            let required = Set((s["required"]?.array?.compactMap(\.string) ?? []).map { Array($0.utf8) })
            return DynamicGenerationSchema(name: name, description: description,
                                           properties: try (s["properties"]?.members ?? []).map { m in
                DynamicGenerationSchema.Property(name: m.key, description: m.value["description"]?.string,
                                                 schema: try node(m.value, name: "\(name)_\(m.key)"),
                                                 isOptional: !required.contains(Array(m.key.utf8)))
            })
        case "array":
            return DynamicGenerationSchema(arrayOf: try node(s["items"] ?? [:], name: "\(name)_item"),
                                           minimumElements: s["minItems"]?.int, maximumElements: s["maxItems"]?.int)
        case "string":
            let guides: [GenerationGuide<String>] = try s["pattern"]?.string.map { [.pattern(try Regex($0))] } ?? []
            return DynamicGenerationSchema(type: String.self, guides: guides)
        case "integer":
            let lo = s["minimum"]?.number?.double.flatMap { Int(exactly: $0.rounded(.up)) }
            let hi = s["maximum"]?.number?.double.flatMap { Int(exactly: $0.rounded(.down)) }
            var guides: [GenerationGuide<Int>] = []
            if let lo, let hi, lo <= hi { guides = [.range(lo...hi)] }
            else if let lo { guides = [.minimum(lo)] }
            else if let hi { guides = [.maximum(hi)] }
            return DynamicGenerationSchema(type: Int.self, guides: guides)
        case "number":
            let lo = s["minimum"]?.number?.double, hi = s["maximum"]?.number?.double
            var guides: [GenerationGuide<Double>] = []
            if let lo, let hi, lo <= hi { guides = [.range(lo...hi)] }
            else if let lo { guides = [.minimum(lo)] }
            else if let hi { guides = [.maximum(hi)] }
            return DynamicGenerationSchema(type: Double.self, guides: guides)
        case "boolean":
            return DynamicGenerationSchema(type: Bool.self)
        case "null":
            return try null(at: name)
        default:
            throw WispError(.invalidArgument, "schema: the node \(name) has no `type`, `enum`, `const` or `anyOf`")
        }
    }

    /// One fixed value: a string as a constant guide, a number as a one-point range.
    static func constant(_ value: JSONValue, name: String) throws -> DynamicGenerationSchema {
        switch value {
        case .string(let s): return DynamicGenerationSchema(type: String.self, guides: [.constant(s)])
        case .number(let n):
            if let i = n.int { return DynamicGenerationSchema(type: Int.self, guides: [.range(i...i)]) }
            guard let d = n.double else {
                throw WispError(.invalidArgument,
                                "schema: the number \(n.text.prefix(40)) at \(name) is out of range for Apple's model")
            }
            return DynamicGenerationSchema(type: Double.self, guides: [.range(d...d)])
        case .null: return try null(at: name)
        default: throw WispError(.invalidArgument,
                                 "schema: `enum`/`const` at \(name) may hold strings, numbers and null only")
        }
    }

    static func null(at name: String) throws -> DynamicGenerationSchema {
        guard #available(macOS 26.4, *) else {
            throw WispError(.invalidArgument,
                            "schema: `null` (at \(name)) needs macOS 26.4 or later with Apple's model")
        }
        return .null
    }
}
#endif
