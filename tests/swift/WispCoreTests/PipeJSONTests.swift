// The core's one JSON codec (WispInfrastructure's JSON/, Pipe/PipeJSON.swift):
// what it writes (pipe messages, stored threads) is JSONEncoder's output (without escaped "/")
// up to key order; what it reads is what JSONDecoder reads, wherever both take the input, and
// it alone decides the rest (the differences are listed in `documentedDifferences`).
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

@Suite struct PipeJSONTests {
    /// Strings that exercise every escape JSONEncoder makes, and some it does not.
    static let texts: [String] = [
        "", "plain", "quote \" backslash \\ slash / end", "tab\tnewline\nreturn\rback\u{8}feed\u{C}",
        String((0..<32).map { Character(Unicode.Scalar(UInt8($0))) }), "del \u{7F} nbsp \u{A0} sep \u{2028}\u{2029}",
        "héllo 🙂 日本語", "</script>", String(repeating: "/", count: 100), "nul \u{0} inside",
    ]

    static func randomText(_ rng: inout some RandomNumberGenerator) -> String {
        let pool: [Unicode.Scalar] = (0..<128).compactMap(Unicode.Scalar.init) + ["é", "🙂", "\u{2028}", "日", "\u{FFFD}"]
        return String(String.UnicodeScalarView((0..<Int.random(in: 0..<40, using: &rng)).map { _ in pool.randomElement(using: &rng)! }))
    }

    /// The same frame as JSONEncoder's but for the order of keys (JSONEncoder's is a hash
    /// table's): the same length (so the same escapes) and the same JSON value.
    func sameAsJSONEncoder<T: JSONWritable>(_ message: T) throws {
        var w = JSONWriter(framed: true)
        message.write(to: &w)
        let ours = w.frame()
        #expect(ours == Frame.encode(message))
        let encoder = JSONEncoder()
        encoder.outputFormatting = .withoutEscapingSlashes
        let theirs = Frame.encode(payload: try encoder.encode(message))
        let shown = "\(String(decoding: ours.dropFirst(4), as: UTF8.self)) vs \(String(decoding: theirs.dropFirst(4), as: UTF8.self))"
        #expect(ours.count == theirs.count, "\(shown)")
        let a = try JSONSerialization.jsonObject(with: Data(ours.dropFirst(4)), options: [.fragmentsAllowed]) as? NSDictionary
        let b = try JSONSerialization.jsonObject(with: Data(theirs.dropFirst(4)), options: [.fragmentsAllowed]) as? NSDictionary
        #expect(a != nil && a == b, "\(shown)")
    }

    @Test func everyCoreMessageIsWrittenAsJSONEncoderWritesIt() throws {
        for text in Self.texts {
            try sameAsJSONEncoder(Ready(backend: text, model: text, pid: 4242, version: text, durable: true))
            try sameAsJSONEncoder(Progress(id: 7, text: text, tokens: 3))
            try sameAsJSONEncoder(Evicted(thread_id: text))
            try sameAsJSONEncoder(Reply.success(Int.max, RespondResult(thread_id: text, created: true, text: text, condensed: false,
                                                                        turns: 12, dropped: 0)))
            try sameAsJSONEncoder(Reply.success(-3, RespondResult(thread_id: "t", created: false, text: text, condensed: true, turns: 1,
                                                                   dropped: 2, prompt_tokens: 0, output_tokens: 99, store_error: text)))
            try sameAsJSONEncoder(ErrorReply.failure(Int.min, WispError(.contextOverflow, text)))
            try sameAsJSONEncoder(Reply.success(1, CloseThreadResult(thread_id: text, closed: true)))
            try sameAsJSONEncoder(Reply.success(2, CancelResult(cancelled: false)))
            try sameAsJSONEncoder(Reply.success(3, PingResult()))
            try sameAsJSONEncoder(Reply.success(4, StatusResult(
                backend: text, model: "m", available: false, reason: text, context_size: 4096, max_threads: 32, max_queue: 0,
                threads: [ThreadInfo(thread_id: text, turns: 1, pending: 0), ThreadInfo(thread_id: "b", turns: 0, pending: 2, live: false, stored: true),
                          ThreadInfo(thread_id: "c", turns: 3, pending: 0, usage: UsageBody(input_tokens: 4), created_at: 1764645123.25,
                                     updated_at: 1764645124.5, first_prompt: text, last_reply: text, instructions: text)],
                tools: ["read_file", text], store_location: text, store_about: text, store_error: nil,
                next_cursor: text)))
            try sameAsJSONEncoder(Reply.success(6, ReadThreadResult(
                thread_id: "t", instructions: text, tools: [text], turns: 9, omitted: 7, condensed: 1,
                items: [TurnItem(prompt: text, reply: text), TurnItem(prompt: "p", reply: "{}", structured: true, cut: true)])))
            try sameAsJSONEncoder(Reply.success(7, ReadThreadResult(thread_id: "t", instructions: nil, tools: [], turns: 0, omitted: 0,
                                                                     condensed: 0, items: [])))
            try sameAsJSONEncoder(Reply.success(5, StatusResult(backend: "b", model: "m", available: true, reason: nil, context_size: 1,
                                                                 max_threads: 1, max_queue: 1, threads: [], tools: [])))
        }
        var rng = SeededGenerator()
        for _ in 0..<100 {
            try sameAsJSONEncoder(Progress(id: Int.random(in: Int.min...Int.max, using: &rng), text: Self.randomText(&rng), tokens: 1))
        }
    }

    @Test func storedTurnsAreWrittenAsJSONEncoderWritesThemAndEarlierThreadFilesReadBack() throws {
        var rng = SeededGenerator()
        for text in Self.texts + (0..<20).map({ _ in Self.randomText(&rng) }) {
            let turns = [Turn(prompt: text, response: text),
                         Turn(prompt: "p", toolExchanges: [ToolExchange(name: "read_file", arguments: text, output: text, failed: true),
                                                           ToolExchange(name: text, arguments: "{}", output: "")], response: "r", tokens: 7)]
            for turn in turns { try sameAsJSONEncoder(turn) }
            #expect(try StoreSchema.exchanges(StoreSchema.json(turns[1].toolExchanges)) == turns[1].toolExchanges)
            #expect(try StoreSchema.strings(StoreSchema.json([text, "b"])) == [text, "b"])
            // A thread file of format 2, as earlier wisps wrote it, reads back (for the import).
            var w = JSONWriter()
            w.object { $0.field("format", 2); $0.field("id", "t"); $0.field("instructions", text); $0.field("tools", [text]); $0.field("roots", [String]()) }
            w.byte(0x0A)
            for (i, turn) in turns.enumerated() {
                turn.write(to: &w)
                w.byte(0x0A)
                w.object { $0.field("turns", i + 1); $0.field("written", 1.5) }
                w.byte(0x0A)
            }
            let read = try ThreadFiles.decode(w.bytes, id: "t")
            #expect(read.state == StoredThread(instructions: text, tools: [text], roots: [], history: turns) && !read.torn)
        }
    }

    /// What JSONDecoder makes of `bytes`, or nil when it refuses them.
    func decoded(_ bytes: [UInt8]) -> Request? {
        try? JSONDecoder().request(from: Data(bytes))
    }

    /// Ours, or nil when it refuses the bytes.
    func ours(_ bytes: [UInt8]) -> Request? { try? PipeJSON.request(bytes) }

    /// Where the reader and JSONDecoder may differ, on purpose: a key given twice (JSONDecoder
    /// takes one of them; which is not defined, so the reader refuses); a trailing comma in an
    /// object or array (JSONDecoder takes it; RFC 8259 does not); a number with a fraction for
    /// an integer field (JSONDecoder takes 86350262860692377.2 as 86350262860692377); text that is
    /// not JSON in the value of a key it skips (JSONDecoder does not look; `JSONSerialization`
    /// refuses it too); a subnormal number, or one below them (JSONDecoder refuses them; Python's
    /// json and JSON.parse, and so the reader, take the nearest double, 0 below the subnormals).
    static func documentedDifference(_ bytes: [UInt8]) -> Bool {
        if let value = try? JSONValue.parse(bytes), holdsATinyNumber(value) { return true }
        if (try? JSONSerialization.jsonObject(with: Data(bytes))) == nil, (try? JSONValue.parse(bytes)) == nil { return true }
        if let e = (catching { () throws(JSONError) in try PipeJSON.request(bytes) }).failureValue {
            if e.message.hasPrefix("expected a whole number") { return true }
            if e.message.contains("expected a member name") || e.message.contains("expected a JSON value") {
                // By bytes: "\r\n" is one Character, which a filter of "\r" and "\n" keeps.
                let text = String(decoding: bytes.filter { ![0x20, 0x0A, 0x0D, 0x09].contains($0) }, as: UTF8.self)
                if text.contains(",}") || text.contains(",]") { return true }
            }
        }
        guard let value = try? JSONValue.parse(bytes), let members = value.members else { return false }
        var seen = Set<[UInt8]>()
        func twice(_ v: JSONValue) -> Bool {
            guard let members = v.members else { return false }
            var keys = Set<[UInt8]>()
            return members.contains { !keys.insert(Array($0.key.utf8)).inserted || twice($0.value) }
        }
        _ = seen.insert([])
        return !members.allSatisfy { seen.insert(Array($0.key.utf8)).inserted } || twice(value)
    }

    static func holdsATinyNumber(_ v: JSONValue) -> Bool {
        switch v {
        case .number(let n):
            guard let d = n.double else { return false }
            return d.isSubnormal || (d == 0 && n.decimal?.isZero == false)
        case .array(let items): return items.contains(where: holdsATinyNumber)
        case .object(let members): return members.contains { holdsATinyNumber($0.value) }
        default: return false
        }
    }

    /// Both read `json` alike: the same request, or both refuse it (but for the documented differences).
    func agrees(_ json: String) {
        let bytes = Array(json.utf8)
        let a = ours(bytes), b = decoded(bytes)
        #expect(a == b || Self.documentedDifference(bytes), "ours: \(String(describing: a)), JSONDecoder: \(String(describing: b)) for \(json)")
    }

    static func randomRequest(_ rng: inout some RandomNumberGenerator) -> Request {
        func maybe<T>(_ value: @autoclosure () -> T) -> T? { Bool.random(using: &rng) ? value() : nil }
        let id = Int.random(in: -5...Int.max, using: &rng)
        switch Int.random(in: 0..<6, using: &rng) {
        case 0:
            let options = maybe(RespondOptions(temperature: maybe(Double.random(in: 0...2, using: &rng)),
                                               max_output_tokens: maybe(Int.random(in: 1...Int(Int32.max), using: &rng)),
                                               timeout_s: maybe(Double.random(in: 0...1e9, using: &rng)),
                                               deadline: maybe(Double.random(in: 0...1e12, using: &rng))))
            return Request(Respond(id: id, prompt: randomText(&rng), thread_id: maybe(randomText(&rng)), instructions: maybe(randomText(&rng)),
                                    tools: maybe((0..<Int.random(in: 0...3, using: &rng)).map { _ in randomText(&rng) }), options: options,
                                    progress: maybe(Bool.random(using: &rng)), roots: maybe([randomText(&rng)]), files: maybe([]),
                                    schema: maybe(randomText(&rng)), fork_from: maybe(randomText(&rng)),
                                    rewind: maybe(Int.random(in: Int.min...Int.max, using: &rng))))
        case 1: return Request(CloseThread(id: id, thread_id: randomText(&rng)))
        case 2: return Request(Cancel(id: id, request: Int.random(in: Int.min...Int.max, using: &rng)))
        case 3: return Request(Status(id: id, query: maybe(randomText(&rng)), limit: maybe(Int.random(in: -9...Int.max, using: &rng)),
                                      cursor: maybe(randomText(&rng))))
        case 4: return Request(ReadThread(id: id, thread_id: randomText(&rng), last: maybe(Int.random(in: 1...Int.max, using: &rng)),
                                              max_bytes: maybe(Int.random(in: 0...Int.max, using: &rng))))
        default: return Request(Ping(id: id))
        }
    }

    @Test func requestsAsTheShimAndJSONEncoderWriteThemAreTakenAndReadAlike() throws {
        var rng = SeededGenerator()
        for _ in 0..<300 {
            let request = Self.randomRequest(&rng)
            let bytes = [UInt8](try JSONEncoder().encode(request))
            #expect(ours(bytes) == request, "\(String(decoding: bytes, as: UTF8.self))")
        }
        // As the shim's msgspec writes them: compact, UTF-8 unescaped, "/" left alone, optionals left out.
        let shim = [
            #"{"op":"respond","id":12,"prompt":"héllo 🙂 a/b \"q\" \\ \n","thread_id":"t-1.x_","options":{"timeout_s":300.0}}"#,
            #"{"op":"respond","id":1,"prompt":"p","tools":["read_file","search_text"],"options":{"temperature":0.7,"max_output_tokens":64,"timeout_s":2.5,"deadline":81234.567891},"progress":true,"roots":["/w"],"files":["a.txt"],"schema":"{\"type\":\"object\"}"}"#,
            #"{"op":"close_thread","id":2,"thread_id":"t"}"#, #"{"op":"cancel","id":3,"request":1}"#,
            #"{"op":"status","id":4}"#, #"{"op":"ping","id":5}"#,
            #"{"op":"status","id":8,"query":"undefined symbol","limit":20,"cursor":"0-41d9-t"}"#,
            #"{"op":"read_thread","id":9,"thread_id":"t","last":3,"max_bytes":32768}"#,
            #"{"op":"respond","id":10,"prompt":"p","thread_id":"t","fork_from":"s","rewind":2}"#, #" { "op" : "ping" , "id" : 6 } "#,
            #"{"op":"respond","id":7,"prompt":"\u00e9\ud83d\ude42\u0000\/"}"#,
        ]
        for json in shim {
            let bytes = Array(json.utf8)
            #expect(ours(bytes) != nil, "the reader should take \(json)")
            #expect(ours(bytes) == decoded(bytes), "\(json)")
        }
    }

    @Test(arguments: [
        // Unknown keys skipped, as JSONDecoder skips them; the rest read as it reads them, or refused.
        #"{"op":"respond","id":1,"prompt":"p","extra":1}"#, #"{"op":"respond","id":1,"prompt":"p","request":2}"#,
        #"{"op":"ping","id":1,"id":2}"#, #"{"op":"ping","id":1.0}"#, #"{"op":"ping","id":1e2}"#, #"{"op":"ping","id":01}"#,
        #"{"op":"ping","id":-0}"#, #"{"op":"ping","id":99999999999999999999}"#, #"{"op":"ping","id":"1"}"#,
        #"{"op":"respond","id":1,"prompt":null}"#, #"{"op":"respond","id":1}"#, #"{"op":"close_thread","id":1,"thread_id":null}"#,
        #"{"op":"respond","id":1,"prompt":"p","options":{"temperature":1e400}}"#,
        #"{"op":"respond","id":1,"prompt":"p","options":{"temperature":1e-400}}"#,
        #"{"op":"respond","id":1,"prompt":"p","options":{"temperature":-0.0,"timeout_s":1E+2}}"#,
        #"{"op":"respond","id":1,"prompt":"p","options":{"temperature":.5}}"#, #"{"op":"respond","id":1,"prompt":"p","options":{"temperature":5.}}"#,
        #"{"op":"respond","id":1,"prompt":"p","options":null,"progress":null,"tools":null,"thread_id":null}"#,
        #"{"op":"respond","id":1,"prompt":"p","options":{},"tools":[],"progress":false}"#,
        #"{"op":"respond","id":1,"prompt":"p","options":{"x":1}}"#, #"{"op":"respond","id":1,"prompt":"p","tools":[1]}"#,
        #"{"op":"respond","id":1,"prompt":"\ud800"}"#, #"{"op":"respond","id":1,"prompt":"\udc00\ud800"}"#,
        #"{"op":"respond","id":1,"prompt":"\x"}"#, #"{"op":"respond","id":1,"prompt":"\u12"}"#,
        #"{"op":"ping","id":1}x"#, #"{"op":"ping","id":1,}"#, #"{"op":"ping",,"id":1}"#, #"{"op":"dance","id":1}"#, "{}", "", "[]",
        #"{"op":"ping","id":1} {"op":"ping","id":2}"#, #"{"op":"ping","id":true}"#, #"{"op":"respond","id":1,"prompt":"p","progress":1}"#,
    ])
    func anyFrameIsReadAsJSONDecoderReadsIt(_ json: String) {
        agrees(json)
    }

    @Test func bytesThatAreNotUTF8AreRefused() {
        for bad: [UInt8] in [[0xFF], [0xC3], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80]] {
            let bytes = Array(#"{"op":"respond","id":1,"prompt":""#.utf8) + bad + Array(#""}"#.utf8)
            #expect(ours(bytes) == nil)
            #expect(decoded(bytes) == nil)
        }
    }

    @Test func aKeyTwiceIsRefusedWithItsName() {
        #expect(throws: JSONError.self) { try PipeJSON.request(Array(#"{"op":"ping","id":1,"id":2}"#.utf8)) }
        let e = #expect(throws: JSONError.self) { try PipeJSON.request(Array(#"{"op":"respond","id":1,"prompt":"p","options":{"timeout_s":1,"timeout_s":2}}"#.utf8)) }
        #expect(e?.description.contains("timeout_s") == true)
    }

    @Test func randomMutationsOfARequestNeverMakeTheTwoDisagree() throws {
        var rng = SeededGenerator()
        let alphabet = Array(#"{}[]:,"\ u0123456789.eE+-abcdefnrtlsux/"#.utf8)
        for _ in 0..<600 {
            var bytes = [UInt8](try JSONEncoder().encode(Self.randomRequest(&rng)))
            for _ in 0..<Int.random(in: 1...3, using: &rng) where !bytes.isEmpty {
                let at = Int.random(in: 0..<bytes.count, using: &rng)
                switch Int.random(in: 0..<3, using: &rng) {
                case 0: bytes[at] = alphabet.randomElement(using: &rng)!
                case 1: bytes.remove(at: at)
                default: bytes.insert(alphabet.randomElement(using: &rng)!, at: at)
                }
            }
            let a = ours(bytes), b = decoded(bytes)
            let why = (catching { () throws(JSONError) in try PipeJSON.request(bytes) }).failureValue.map { "\($0)" } ?? "-"
            #expect(a == b || Self.documentedDifference(bytes), "ours: \(why), JSONDecoder: \(String(describing: b)) for \(String(decoding: bytes, as: UTF8.self))")
        }
    }
}

extension Result {
    var failureValue: Failure? { if case .failure(let e) = self { e } else { nil } }
}
