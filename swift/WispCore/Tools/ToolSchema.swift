import Foundation

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
            var fields = [#""type":"\#(p.kind.rawValue)""#]
            if let d = p.description { fields.append(#""description":\#(Self.quoted(d))"#) }
            if let m = p.minimum { fields.append(#""minimum":\#(m)"#) }
            return "\(Self.quoted(p.name)):{\(fields.joined(separator: ","))}"
        }
        return #"{"type":"object","properties":{\#(props.joined(separator: ","))},"required":[\#(required.map(Self.quoted).joined(separator: ","))],"additionalProperties":false}"#
    }

    private static func quoted(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
