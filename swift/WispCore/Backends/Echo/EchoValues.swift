import WispInfrastructure

/// The echo backend's value for a schema (the echo contract's "Structured output" table):
/// the first choice where there is one, else the least value of each kind.
extension OutputSchema {
    /// The echo backend's value for this schema (the echo contract's "Structured output" table).
    /// Refused (`invalid_argument`) when it would be too large to send; stops when the call is cancelled.
    public func echoValue(n: Int) throws(WispError) -> JSONValue {
        guard node.echoBytes <= Self.maxEchoBytes else {
            throw WispError(.invalidArgument, "schema: the value echo would build for it is about \(node.echoBytes) "
                + "bytes, over wisp's \(Self.maxEchoBytes)-byte limit (look at minItems); use smaller bounds")
        }
        var budget = Budget()
        return try Self.echoValue(node, n: n, &budget)
    }

    private static func echoValue(_ s: Node, n: Int, _ budget: inout Budget) throws(WispError) -> JSONValue {
        try budget.step()
        if let c = s.const { return c }
        if let first = s.choices?.first { return first }
        if let first = (s.anyOf ?? s.oneOf)?.first { return try echoValue(first, n: n, &budget) }
        switch s.kind {
        case .object:
            var members: [JSONMember] = []
            members.reserveCapacity(s.properties.count)
            for p in s.properties { members.append(JSONMember(p.key, try echoValue(p.node, n: n, &budget))) }
            return .object(members)
        case .array:
            let item = try s.items.map { node throws(WispError) in try echoValue(node, n: n, &budget) } ?? .null
            return .array(Array(repeating: item, count: max(s.minItems ?? 0, 1)))
        case .string: return .string("echo \(n)")
        case .integer: return .number(s.minimum.map(wholeNumber) ?? JSONNumber(n))
        case .number: return .number(s.minimum ?? JSONNumber(n))
        case .boolean: return .bool(true)
        default: return .null
        }
    }

    /// An integer schema's whole `minimum` in plain digits (1e3 as 1000, 5.0 as 5), exactly; a
    /// bound that is not whole stays as written (the shim refuses those for integers).
    static func wholeNumber(_ n: JSONNumber) -> JSONNumber {
        guard let d = n.decimal, d.isInteger else { return n }
        if d.isZero { return JSONNumber(0) }
        var text = d.negative ? "-" : ""
        text += String(decoding: d.digits, as: UTF8.self)
        text += String(repeating: "0", count: d.exponent)
        return JSONNumber(unchecked: text)
    }
}
