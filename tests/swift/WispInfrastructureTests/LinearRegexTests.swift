import Foundation
import Testing
@testable import WispInfrastructure

/// The engine's suites, one at a time: they are CPU-heavy, and some have a time limit.
@Suite(.serialized) struct Regex {}

extension Regex {
    @Suite struct LinearRegexMatching {
        /// pattern, text, whether the text contains a match.
        static let table: [(String, String, Bool)] = [
            ("abc", "xxabcxx", true),
            ("abc", "ab c", false),
            ("a.c", "abc", true),
            ("a.c", "ac", false),
            ("^abc", "abcd", true),
            ("^abc", "xabc", false),
            ("abc$", "xabc", true),
            ("abc$", "abcx", false),
            ("^$", "", true),
            ("^$", "x", false),
            (#"\Aab\z"#, "ab", true),
            ("colou?r", "color", true),
            ("colou?r", "colour", true),
            ("colou?r", "colouur", false),
            ("ab*c", "ac", true),
            ("ab+c", "ac", false),
            ("ab+c", "abbbc", true),
            ("a{3}", "aa", false),
            ("a{3}", "xaaax", true),
            ("^a{2,3}$", "aaaa", false),
            ("^a{2,3}$", "aaa", true),
            ("^a{2,}$", "aaaaaaa", true),
            ("^a{2,}$", "a", false),
            ("x{,2}", "x{,2}", true),
            ("cat|dog", "hotdog", true),
            ("cat|dog", "cow", false),
            ("^(cat|dog)s?$", "cats", true),
            ("^(?:cat|dog)s?$", "dogz", false),
            ("(?<animal>cat)", "a cat", true),
            ("[abc]+d", "xxcabd", true),
            ("[a-f0-9]{4}", "zz9f3ezz", true),
            ("[a-f0-9]{4}", "zz9g3ezz", false),
            ("[^a-z]", "abc", false),
            ("[^a-z]", "abC", true),
            ("[]x]", "]", true),
            (#"[\]\\]"#, #"\"#, true),
            ("[a-]", "-", true),
            (#"\d+\.\d+"#, "version 1.25", true),
            (#"\d"#, "no digits", false),
            (#"\D"#, "123", false),
            (#"^\w+$"#, "snake_case9", true),
            (#"^\w+$"#, "kebab-case", false),
            (#"\W"#, "kebab-case", true),
            (#"a\sb"#, "a\tb", true),
            (#"\S"#, " \t ", false),
            (#"\bword\b"#, "a word here", true),
            (#"\bword\b"#, "swordfish", false),
            (#"\Bord"#, "sword", true),
            (#"\(x\)"#, "f(x)", true),
            (#"\x41\u0042"#, "AB", true),
            ("(?i)hello", "Say HELLO", true),
            ("(?i)[a-c]+z", "xBCAZ", true),
            ("hello", "HELLO", false),
            ("é+", "caféé", true),
            ("a.?b", "a😀b", true),
            ("(a*)*b", "aaab", true),
            ("(a|ab)(c|bcd)(d*)", "abcd", true),
            ("a*?b", "aab", true),
            ("(a+)+$", String(repeating: "a", count: 50) + "b", false),
        ]

        @Test func matchesTheTable() async throws {
            try await offPool { try Self.checkTable() }
        }

        static func checkTable() throws {
            for (pattern, text, expected) in Self.table {
                let re = try LinearRegex(pattern)
                #expect(re.matches(text[...]) == expected, "\(pattern) on \(text.prefix(60))")
            }
        }

        @Test func agreesWithNSRegularExpressionOnTheTable() async throws {
            try await offPool { try Self.checkAgainstICU() }
        }

        static func checkAgainstICU() throws {
            // Where both engines accept a pattern they must agree (ICU is the reference it replaced).
                    // (Not the catastrophic one: ICU would backtrack through it for a minute.)
            for (pattern, text, _) in Self.table where !pattern.contains("{,") && !pattern.hasPrefix("(a+)+") {
                let ns = try NSRegularExpression(pattern: pattern)
                let expected = ns.firstMatch(in: text, range: NSRange(text.startIndex..., in: text)) != nil
                #expect(try LinearRegex(pattern).matches(text[...]) == expected, "\(pattern) on \(text.prefix(60))")
            }
        }

        static let refused: [(String, String)] = [
            (#"(a)\1"#, "backreference \\1"),
            ("(?=a)b", "lookahead"),
            ("(?!a)b", "lookahead"),
            ("(?<=a)b", "lookbehind"),
            ("(?<!a)b", "lookbehind"),
            ("(?>a+)b", "atomic group"),
            ("a++", "possessive"),
            (#"\p{L}"#, "Unicode property class"),
            (#"\k<x>"#, "named backreference"),
            ("(?s).", "inline flags"),
            ("[[:alpha:]]", "POSIX class"),
            ("(", "missing )"),
            ("a)", "unmatched )"),
            ("[abc", "missing ]"),
            ("*a", "nothing to repeat"),
            ("[z-a]", "out of order"),
            ("a{2000}", "repeat count"),
            (#"\q"#, "escape \\q"),
            ("(a{1000}){1000}", "too large"),
        ]

        @Test func refusesWhatItCannotMatchInLinearTimeNamingTheConstruct() {
            for (pattern, construct) in Self.refused {
                do {
                    _ = try LinearRegex(pattern)
                    Issue.record("\(pattern): expected a refusal")
                } catch {
                    #expect(error.message.contains(construct), "\(pattern): \(error.message)")
                }
            }
        }

        @Test func theCatastrophicPatternAnswersFast() async throws {
            try await offPool { try Self.checkCatastrophic() }
        }

        static func checkCatastrophic() throws {
            let line = String(repeating: "a", count: 100_000) + "b"
            let clock = ContinuousClock()
            // Debug builds (swift test) run this loop many times slower than the release core, which
            // tests/python/test_tools.py holds to well under a second.
            for pattern in ["(a+)+$", "^(a|aa)*$", "(a*)*(a*)*c", "^(a?){50}a{50}$"] {
                let re = try LinearRegex(pattern)
                let start = clock.now
                #expect(re.matches(line[...]) == false, "\(pattern)")
                let elapsed = clock.now - start
                print("linear regex: \(pattern) over a 100 KB line: \(elapsed)")
                if !underSanitizer { #expect(elapsed < .seconds(3), "\(pattern) took \(elapsed)") }
            }
        }

        @Test func aMatchStopsAtItsDeadline() async throws {
            let re = try LinearRegex("(a|b|c|d|e){1,50}z")
            let line = String(repeating: "a", count: 300_000)
            let (result, elapsed) = try await offPool {
                let clock = ContinuousClock()
                let start = clock.now
                return (re.matches(line[...], deadline: clock.now + .milliseconds(50)), clock.now - start)
            }
            #expect(result == nil, "the match ran to its end past its deadline")
            // How late it stops depends on the machine's load too: the bound only catches a check
            // that comes far too seldom.
            if !underSanitizer { #expect(elapsed < .seconds(10)) }
        }
    }
}

/// Runs CPU-heavy test code on a thread of its own: on a 2-core machine the cooperative pool
/// has two threads, and the timing tests of other suites need them meanwhile.
func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { done in
        Thread { done.resume(with: Result { try body() }) }.start()
    }
}

/// Whether this test process runs under a sanitizer, which slows code many times over: a time
/// bound then says nothing about the code under test, so the timed tests do not check theirs.
let underSanitizer: Bool = {
    guard let me = dlopen(nil, RTLD_NOW) else { return false }
    defer { dlclose(me) }
    return dlsym(me, "__tsan_init") != nil || dlsym(me, "__asan_init") != nil
}()
