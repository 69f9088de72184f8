import WispInfrastructure

/// A model tool's arguments as a value: an object of typed properties, rendered once as the
/// compact JSON Schema text `ModelTool.parametersSchema` carries (every backend reads that text).
struct ToolSchema {
    struct Property {
        enum Kind: String { case string, integer, boolean }
        var name: String
        var kind: Kind
        var description: String?
        var minimum: Int?

        static func string(_ name: String, _ description: String? = nil) -> Property {
            Property(name: name, kind: .string, description: description)
        }
        static func integer(_ name: String, minimum: Int? = nil) -> Property {
            Property(name: name, kind: .integer, minimum: minimum)
        }
        static func boolean(_ name: String, _ description: String? = nil) -> Property {
            Property(name: name, kind: .boolean, description: description)
        }
    }

    var properties: [Property]
    var required: [String]

    /// `{"type":"object","properties":{…},"required":[…],"additionalProperties":false}`, in
    /// declaration order: no other key is allowed, so the model cannot invent one.
    var json: String {
        let props = properties.map { p in
            var fields: [JSONMember] = [JSONMember("type", .string(p.kind.rawValue))]
            if let d = p.description { fields.append(JSONMember("description", .string(d))) }
            if let m = p.minimum { fields.append(JSONMember("minimum", .number(JSONNumber(m)))) }
            return JSONMember(p.name, .object(fields))
        }
        let schema: JSONValue = ["type": "object", "properties": .object(props),
                                 "required": .array(required.map { .string($0) }),
                                 "additionalProperties": false]
        return schema.jsonText
    }
}
