// The JSON value, reader and writer on their own (WispInfrastructure's JSON/): key
// order kept, numbers exact, keys compared as code points, what is not JSON refused. Against
// JSONEncoder/JSONDecoder, through the pipe's messages: WispCoreTests/PipeJSONTests.swift.
import Foundation
import Testing
@testable import WispInfrastructure

@Suite struct JSONTests {
    @Test func parsesAndWritesJSONKeepingKeyOrder() throws {
        let text = #" {"z": [1, 2.5, -3e2, true, false, null], "a": "t\u00e9\"\n\ud83d\ude00", "m": {}} "#
        let v = try JSONValue.parse(text)
        #expect(v.members?.map(\.key) == ["z", "a", "m"])
        #expect(v["a"] == .string("té\"\n😀"))
        // Numbers as written: exact, never rounded through a Double.
        #expect(v.jsonText == #"{"z":[1,2.5,-3e2,true,false,null],"a":"té\"\n😀","m":{}}"#)
        #expect(try JSONValue.parse(v.jsonText) == v)
    }

    @Test func rejectsWhatIsNotJSON() {
        for bad in ["", "{", #"{"a":1"#, #"{"a" 1}"#, "[1,]", "01", "1.", "-", "tru", #""abc"#, "\"a\u{01}b\"", "{} x", "NaN", #"{'a':1}"#] {
            #expect(throws: JSONError.self, "\(bad)") { try JSONValue.parse(bad) }
        }
        let deep = String(repeating: "[", count: 600) + String(repeating: "]", count: 600)
        #expect(throws: JSONError.self) { try JSONValue.parse(deep) }
    }

    @Test func slashesAreNotEscaped() {
        var w = JSONWriter()
        w.string(String(repeating: "/", count: 1000))
        #expect(w.bytes.count == 1002)
        #expect(JSONValue.string("a/b").jsonText == #""a/b""#)
    }

    /// JSON has no NaN or infinity; the writer says `null` for them rather than trap the core.
    @Test func aDoubleJSONCannotHoldIsWrittenAsNull() throws {
        for value in [Double.nan, -Double.nan, .infinity, -.infinity, .signalingNaN] {
            var w = JSONWriter()
            w.object { w in
                w.field("x", value)
                w.field("y", 1.5)
            }
            let text = String(decoding: w.bytes, as: UTF8.self)
            #expect(text == #"{"x":null,"y":1.5}"#, "\(value)")
            #expect(try JSONValue.parse(text)["x"] == .null)
        }
        #expect(JSONNumber(Double.nan) == nil && JSONNumber(-Double.infinity) == nil)
    }

    @Test func numbersAreKeptExactly() throws {
        let big = try JSONValue.parse("9007199254740993")
        #expect(big.jsonText == "9007199254740993")
        #expect(big != (try JSONValue.parse("9007199254740992")))
        #expect(try JSONValue.parse("1") == (try JSONValue.parse("1.0")))
        #expect(try JSONValue.parse("1e2") == (try JSONValue.parse("100")))
        #expect(try JSONValue.parse("0.1") != (try JSONValue.parse("0.1000000000000000000001")))
        #expect(try JSONValue.parse("-0") == (try JSONValue.parse("0.0e5")))
        #expect(try JSONValue.parse("1700000000000000001").jsonText == "1700000000000000001")
        let a = try #require(JSONValue.parse("1.7e18").number), b = try #require(JSONValue.parse("1700000000000000001").number)
        #expect(a < b && !(b < a))
        let n = try #require(JSONValue.parse("-2.5").number), m = try #require(JSONValue.parse("-2.4999999999999999999").number)
        #expect(n < m)
        #expect(try JSONValue.parse("1e2").int == 100)
        #expect(try JSONValue.parse("99999999999999999999").int == nil)
    }

    @Test func keysAreCodePointsNotCanonicallyEquivalentText() throws {
        let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
        #expect(nfc == nfd, "Swift's String == takes them as equal: the reason keys are compared as scalars")
        let v = try JSONValue.parse(#"{"caf\u00e9":1,"cafe\u0301":2}"#)
        #expect(v.members?.count == 2)
        #expect(v[nfc]?.int == 1 && v[nfd]?.int == 2)
        #expect(JSONValue.string(nfc) != JSONValue.string(nfd))
    }
}
