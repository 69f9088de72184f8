// A number from outside, taken only in its range (Support/OutsideNumber.swift), and the
// saturating arithmetic on what it lets through.
import Foundation
import Testing
import WispInfrastructure

@Suite struct OutsideNumbers {
    @Test func jsonNumbersAsJSONSerializationGivesThem() throws {
        let object = try #require(try JSONSerialization.jsonObject(with: Data("""
            {"ok": 4096, "big": 9223372036854775807, "huge": 1e300, "past": 18446744073709551616,
             "frac": 1.5, "whole": 2.0, "neg": -1, "text": "7", "null": null}
            """.utf8)) as? [String: Any])
        let range = 0...Int(Int32.max)
        #expect(OutsideNumber.int(object["ok"], in: range) == 4096)
        #expect(OutsideNumber.int(object["whole"], in: range) == 2)
        for key in ["big", "huge", "past", "frac", "neg", "text", "null", "absent"] {
            #expect(OutsideNumber.int(object[key], in: range) == nil, "\(key)")
        }
        #expect(OutsideNumber.int(Double.nan, in: range) == nil && OutsideNumber.int(-Double.infinity, in: range) == nil)
    }

    @Test func textDigits() {
        #expect(OutsideNumber.int("42", in: 0...100) == 42)
        #expect(OutsideNumber.int("1f", radix: 16, in: 0...100) == 31)
        for text in ["-0", "-5", "101", "99999999999999999999", "", " 4", "4 ", "0x10", "1e3"] {
            #expect(OutsideNumber.int(text, in: 0...100) == nil, "\(text.debugDescription)")
        }
        #expect(OutsideNumber.int("-5", in: -10...10) == -5)
    }

    @Test func arithmeticSaturates() {
        #expect(Int.max.addingClamped(1) == .max && Int.min.addingClamped(-1) == .min && 2.addingClamped(3) == 5)
        #expect(Int.min.subtractingClamped(1) == .min && Int.max.subtractingClamped(-1) == .max && 5.subtractingClamped(7) == -2)
        #expect(Int.max.multipliedClamped(by: 2) == .max && Int.max.multipliedClamped(by: -2) == .min && (-3).multipliedClamped(by: 4) == -12)
        #expect([Int.max, Int.max, -5].clampedSum() == Int.max - 5, "held at the top, then 5 less")
        #expect([1, 2, 3].clampedSum() == 6)
    }
}
