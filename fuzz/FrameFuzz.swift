// libFuzzer target for the core's request reader (framing, request decoding, the `rejected`
// path) and its one JSON reader (WispInfrastructure/JSON/JSON.swift): any bytes on stdin must
// give requests, rejections or a PipeProtocolError, never a crash or a hang. And, differentially:
// - a request the reader takes is the one JSONDecoder reads, and one JSONDecoder reads the
//   reader takes too, but for the documented differences (PipeJSONTests.documentedDifference:
//   a key twice, a trailing comma, a fraction for an integer, non-JSON in a skipped value);
// - a JSON value the reader takes is the one JSONSerialization reads, numbers compared
//   exactly (an integer as an integer, any other number as the Double both round it to).
// Built and run by `make fuzz` (swiftc -sanitize=fuzzer,address over WispCore's sources, with
// this file and tests/swift/WispCoreTests/RequestCoding.swift, JSONDecoder's reading of a request,
// in the module; WispInfrastructure built as a module of its own).
import Foundation
import WispInfrastructure

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: start, count: count)
    // The input as one payload, and (the seeds are framed traffic) past a frame's length prefix.
    for payload in [bytes[...], bytes.dropFirst(4)] {
        let json = UnsafeRawBufferPointer(rebasing: payload)
        checkRequest(json)
        checkValue(json)
    }
    var reader = RequestReader(maxFrameBytes: 1 << 20)
    // Feed in two uneven pieces so split handling is exercised too.
    let cut = count / 3
    for piece in [bytes[0..<cut], bytes[cut..<count]] {
        do {
            for item in try reader.feed(UnsafeRawBufferPointer(rebasing: piece)) {
                if case .rejected(let id, let message) = item, id <= 0 || message.isEmpty {
                    fatalError("a rejection must name a positive id and a reason")
                }
            }
        } catch {
            return 0
        }
    }
    _ = try? reader.finish()
    return 0
}

func checkRequest(_ json: UnsafeRawBufferPointer) {
    let data = Data(json)
    let theirs = try? JSONDecoder().request(from: data)
    let ours: Result<Request, JSONError>
    do throws(JSONError) { ours = .success(try PipeJSON.request(json)) } catch { ours = .failure(error) }
    switch (ours, theirs) {
    case (.success(let a), let b?):
        if a != b { fatalError("the reader read \(a) where JSONDecoder read \(b)") }
    case (.success(let a), nil):
        fatalError("the reader read \(a) where JSONDecoder refused the text")
    case (.failure(let e), let b?):
        if !documented(e, json) { fatalError("the reader refused (\(e)) what JSONDecoder read as \(b)") }
    case (.failure, nil):
        break
    }
}

/// PipeJSONTests.documentedDifference's rules, on the reader's reason.
func documented(_ e: JSONError, _ json: UnsafeRawBufferPointer) -> Bool {
    if e.message.contains("appears twice") || e.message.hasPrefix("expected a whole number") { return true }
    if (try? JSONSerialization.jsonObject(with: Data(json), options: [.fragmentsAllowed])) == nil { return true }
    // By bytes, not Characters: "\r\n" is one Character, which a filter of "\r" and "\n" keeps.
    let text = String(decoding: json.filter { ![0x20, 0x0A, 0x0D, 0x09].contains($0) }, as: UTF8.self)
    return text.contains(",}") || text.contains(",]")
}

func checkValue(_ json: UnsafeRawBufferPointer) {
    guard let ours = try? JSONValue.parse(json) else { return }
    guard let theirs = try? JSONSerialization.jsonObject(with: Data(json), options: [.fragmentsAllowed]) else {
        // The reader keeps numbers a Double cannot hold (1e400): JSONSerialization refuses those.
        if !hasNumberBeyondDouble(ours) { fatalError("the reader took \(ours.jsonText.prefix(200)) where JSONSerialization refused it") }
        return
    }
    if let problem = difference(ours, theirs) { fatalError("the reader and JSONSerialization differ: \(problem)") }
}

func hasNumberBeyondDouble(_ v: JSONValue) -> Bool {
    switch v {
    case .number(let n):
        guard let d = n.double else { return true }
        return d.magnitude < Double.leastNormalMagnitude && !(n.decimal?.isZero ?? true)
    case .array(let items): return items.contains(where: hasNumberBeyondDouble)
    case .object(let members): return members.contains { hasNumberBeyondDouble($0.value) }
    default: return false
    }
}

func difference(_ a: JSONValue, _ b: Any) -> String? {
    switch a {
    case .null: return b is NSNull ? nil : "null vs \(b)"
    case .bool(let x):
        guard let n = b as? NSNumber else { return "bool vs \(b)" }
        return n.boolValue == x ? nil : "\(x) vs \(n)"
    case .number(let x):
        guard let n = b as? NSNumber else { return "number vs \(b)" }
        if let big = n as? NSDecimalNumber {
            // Past 64 bits JSONSerialization keeps about 38 significant digits: compare those.
            guard let ours = x.decimal, let theirs = JSONValue.number(JSONNumber(unchecked: big.stringValue)).number?.decimal else {
                return "\(x.text) vs \(big)"
            }
            let same = ours.negative == theirs.negative && ours.magnitude == theirs.magnitude
                && significant(ours.digits) == significant(theirs.digits)
            return same ? nil : "\(x.text) vs \(big)"
        }
        let type = String(cString: n.objCType)
        if "qlisQLIS".contains(type), let i = x.int { return Int64(i) == n.int64Value ? nil : "\(x.text) vs \(n)" }
        guard let d = x.double else { return "\(x.text) is out of range, JSONSerialization read \(n)" }
        return d == n.doubleValue || (x.int != nil && Double(x.int!) == n.doubleValue) ? nil : "\(x.text) vs \(n)"
    case .string(let x):
        guard let s = b as? String else { return "string vs \(b)" }
        return Array(x.unicodeScalars) == Array(s.unicodeScalars) ? nil : "\(x.debugDescription) vs \(s.debugDescription)"
    case .array(let items):
        guard let list = b as? [Any], list.count == items.count else { return "array vs \(b)" }
        for (x, y) in zip(items, list) { if let p = difference(x, y) { return p } }
        return nil
    case .object(let members):
        guard let dict = b as? [String: Any] else { return "object vs \(b)" }
        // Keys twice, or keys only canonically equivalent: Foundation's dictionary merges them, JSON does not.
        var keys = Set<String>()
        guard members.allSatisfy({ keys.insert($0.key).inserted }), keys.count == dict.count else { return nil }
        for m in members {
            guard let y = dict[m.key] else { return "key \(m.key.debugDescription) missing" }
            if let p = difference(m.value, y) { return p }
        }
        return nil
    }
}

/// The first 30 significant digits, trailing zeros dropped.
func significant(_ digits: [UInt8]) -> [UInt8] {
    var d = Array(digits.prefix(30))
    while d.last == 0x30 { d.removeLast() }
    return d
}
