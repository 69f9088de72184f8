#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif

/// JSON as `[String: Any]` trees, for the openai backend's bodies, read and written by wisp's own
/// codec (the core does not link full Foundation's `JSONSerialization`, issue 46). Numbers read
/// as `Int` when whole and in range, else `Double`, as `OutsideNumber.int` takes them; `null` is
/// `NSNull`'s stand-in `JSONObjects.null`.
public enum JSONObjects {
    public struct Null: Sendable, Equatable {}
    public static let null = Null()

    public struct Unwritable: Error, CustomStringConvertible {
        public let description: String
    }

    /// The tree `data` holds, or nil when it is not JSON.
    public static func object(_ data: Data) -> Any? {
        guard let value = try? JSONValue.parse(data) else { return nil }
        return tree(value)
    }

    /// Compact JSON text for a tree of dictionaries, arrays, strings, numbers, bools and `null`.
    public static func data(_ object: Any) throws(Unwritable) -> Data {
        Data(try value(object).jsonText.utf8)
    }

    static func tree(_ value: JSONValue) -> Any {
        switch value {
        case .null: return null
        case .bool(let b): return b
        case .string(let s): return s
        case .number(let n): return n.isInteger ? (n.int.map { $0 as Any } ?? n.double ?? 0) : (n.double ?? 0)
        case .array(let a): return a.map(tree)
        case .object(let members):
            var d: [String: Any] = [:]
            for m in members where d[m.key] == nil { d[m.key] = tree(m.value) }
            return d
        }
    }

    static func value(_ object: Any) throws(Unwritable) -> JSONValue {
        switch object {
        case let b as Bool: return .bool(b)
        case let n as Int: return .number(JSONNumber(n))
        case let d as Double:
            guard let n = JSONNumber(d) else { throw Unwritable(description: "\(d) is not a JSON number") }
            return .number(n)
        case let s as String: return .string(s)
        case let s as Substring: return .string(String(s))
        case is Null: return .null
        case let v as JSONValue: return v
        case let a as [Any]:
            var out: [JSONValue] = []
            for e in a { out.append(try value(e)) }
            return .array(out)
        case let d as [String: Any]:
            var out: [JSONMember] = []
            for (k, v) in d.sorted(by: { $0.key < $1.key }) { out.append(JSONMember(k, try value(v))) }
            return .object(out)
        default: throw Unwritable(description: "a \(type(of: object)) is not JSON")
        }
    }
}
