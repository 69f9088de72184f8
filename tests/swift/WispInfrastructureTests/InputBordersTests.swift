// Text and numbers from outside at their borders: `String.clipped(toBytes:)` (Support/BoundedText.swift)
// bounds by bytes whatever the shape of the text's clusters; the JSON reader takes every valid number
// (subnormals, -0, exponents with leading zeros) and keeps its text exactly.
import Testing
@testable import WispInfrastructure

@Suite struct BoundedTextTests {
    @Test func textThatFitsIsNotCut() {
        #expect("abc".clipped(toBytes: 3) == ("abc", false))
        #expect("".clipped(toBytes: 0) == ("", false))
    }

    @Test(arguments: [
        ("one e with a megabyte of combining marks", "e" + String(repeating: "\u{301}", count: 500_000)),
        ("a ZWJ chain", String(repeating: "\u{1F469}\u{200D}", count: 200_000) + "\u{1F469}"),
        ("regional indicators", String(repeating: "\u{1F1EB}\u{1F1F7}", count: 100_000)),
        ("ASCII", String(repeating: "x", count: 1_000_000)),
    ])
    func anyShapeIsBoundedInBytes(_ shape: String, _ text: String) {
        for bound in [0, 1, 3, 4, 5, 80, 160, 4096] {
            let (clipped, cut) = text.clipped(toBytes: bound)
            #expect(cut, "\(shape)")
            #expect(clipped.utf8.count <= max(bound, String.cutMark.utf8.count), "\(shape) at \(bound)")
            #expect(clipped.hasSuffix(String.cutMark), "\(shape)")
            // What is kept is the text's own beginning, scalar for scalar.
            let kept = Array(clipped.unicodeScalars.dropLast())
            #expect(Array(text.unicodeScalars.prefix(kept.count)) == kept, "\(shape) at \(bound)")
        }
    }

    @Test func aCutEndsAtACharacterWhenOneFits() {
        // "abcdefgh" then one cluster of e and ten acute accents (21 bytes), then more.
        let text = "abcdefgh" + "e" + String(repeating: "\u{301}", count: 10) + "xyz"
        #expect(text.clipped(toBytes: 15).text == "abcdefgh…", "the cluster is left whole, not split")
        #expect((text + "w").clipped(toBytes: 8 + 21 + 3).text == "abcdefgh" + "e" + String(repeating: "\u{301}", count: 10) + "…")
        // Backing up to the cluster's start would keep less than half: the cluster is cut instead.
        #expect(("a" + text.dropFirst(8)).clipped(toBytes: 12).text == "ae" + String(repeating: "\u{301}", count: 3) + "…")
        // Two flags (8 bytes each): room for three indicators must not leave half a flag.
        let flags = "\u{1F1EB}\u{1F1F7}\u{1F1E9}\u{1F1EA}x"
        #expect(flags.clipped(toBytes: 12 + 3).text == "\u{1F1EB}\u{1F1F7}…")
    }

    @Test func oneClusterLargerThanTheBoundIsCutAtAScalar() {
        let text = "e" + String(repeating: "\u{301}", count: 1000)
        let (clipped, cut) = text.clipped(toBytes: 20)
        #expect(cut)
        // e (1 byte) and eight accents (2 bytes each) fill the 17 bytes before the mark.
        #expect(clipped == "e" + String(repeating: "\u{301}", count: 8) + "…")
    }
}

@Suite struct NumberBordersTests {
    func double(_ text: String) throws -> Double {
        try Array(text.utf8).withUnsafeBytes { buffer in
            var reader = JSONReader(buffer)
            let value = try reader.double()
            try reader.end()
            return value
        }
    }

    @Test(arguments: [
        ("5e-324", Double.leastNonzeroMagnitude), ("4.9406564584124654e-324", Double.leastNonzeroMagnitude),
        ("2.2250738585072014e-308", Double.leastNormalMagnitude),
        ("2.225073858507201e-308", Double.leastNormalMagnitude.nextDown),
        ("1.7976931348623157e308", Double.greatestFiniteMagnitude), ("-1.7976931348623157E+308", -Double.greatestFiniteMagnitude),
        ("1e0000000000000000000002", 100), ("1E-0000000000000000000000000001", 0.1), ("0.01", 0.01),
        ("1e-400", 0), // below the least subnormal: Python's json and JSON.parse read 0.0 too
    ])
    func everyValidNumberInADoublesRangeIsRead(_ text: String, _ value: Double) throws {
        #expect(try double(text) == value, "\(text)")
    }

    @Test func minusZeroKeepsItsSign() throws {
        #expect(try double("-0").sign == .minus)
        #expect(try double("-0.0e-5").sign == .minus)
    }

    @Test func onlyANumberPastTheRangeIsRefusedAndItsTextIsBounded() {
        let long = "1" + String(repeating: "0", count: 100_000) + "e400"
        for text in ["1e400", "-1e309", long] {
            do {
                _ = try double(text)
                Issue.record("\(text.prefix(20)) is past a double's range")
            } catch let e as JSONError {
                #expect(e.message.contains("out of range") && e.message.utf8.count < 200, "\(e.message.prefix(300))")
            } catch {
                Issue.record("\(error)")
            }
        }
    }

    @Test func exponentsAreBoundedBySignificantDigitsNotLeadingZeros() throws {
        let zeros = String(repeating: "0", count: 1000)
        #expect(try JSONValue.parse("1e\(zeros)3").number?.int == 1000)
        #expect(try JSONValue.parse("1e\(zeros)3") == (try JSONValue.parse("1000")))
        #expect(throws: JSONError.self) { try JSONValue.parse("1e1234567890123456789") }
    }

    @Test func numbersKeepTheTextTheyWereWrittenWith() throws {
        let text = #"{"price":19.99,"step":0.01,"tiny":5e-324,"edge":2.2250738585072014e-308,"z":-0,"# +
            #""tens":1.10,"exact":0.1000000000000000055511151231257827,"big":1.7976931348623157e308,"e":1e0000000000000000000001}"#
        let value = try JSONValue.parse(text)
        #expect(value.jsonText == text)
        #expect(value["step"] != (try JSONValue.parse("0.010000000000000002")))
        #expect(value["tens"] == (try JSONValue.parse("1.1")), "the same value, however written")
    }
}
