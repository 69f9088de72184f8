// search_text with `regex: true` (Tools/Catalogue.swift over the linear engine,
// WispInfrastructure's LinearRegex): a catastrophic pattern ends, and a refused one reaches the
// caller as an argument error naming the construct.
import Foundation
import Testing
@testable import WispCore

// Inside ModelTools, whose tests run one at a time: the searches there have a time limit.
extension ModelTools {
    @Suite struct RegexSearch {
        @Test func searchTextWithTheBombAnswersQuickly() async throws {
            let base = NSTemporaryDirectory() + "wisp-regex-" + UUID().uuidString
            try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: base) }
            try (String(repeating: "a", count: 100_000) + "b\n").write(toFile: base + "/bomb.txt", atomically: true, encoding: .utf8)
            let search = ToolCatalogue.tools(roots: Roots([base])).first { $0.name == "search_text" }!
            let (found, elapsed) = await onOwnThread {
                let clock = ContinuousClock()
                let start = clock.now
                // A generous scan limit: this checks that the match ends, not how fast a loaded debug build is.
                var limits = ToolCatalogue.Limits()
                limits.maxScanSeconds = 60
                let found = Result { () throws(WispError) in
                    try ToolCatalogue.searchText(roots: Roots([base]), pattern: "(a+)+$", path: ".", regex: true, limits: limits)
                }
                return (found, clock.now - start)
            }
            let out = try found.get()
            print("search_text (a+)+$ over a 100 KB line: \(elapsed)")
            #expect(out == "no matches")
            if !underSanitizer { #expect(elapsed < .seconds(10)) }
            await #expect(throws: WispError.self) { try await search.call(#"{"pattern": "(a)\\1", "regex": true}"#) }
        }

        /// Every refusal of the engine (LinearRegexTests' table) reaches the caller through this one path.
        @Test(arguments: [(#"(a)\1"#, "backreference \\1"), ("(?=a)b", "lookahead"), ("a{2000}", "repeat count"),
                          ("(a{1000}){1000}", "too large")])
        func aRefusedPatternIsAnArgumentErrorNamingTheConstruct(_ pattern: String, _ construct: String) throws {
            let base = NSTemporaryDirectory() + "wisp-regex-" + UUID().uuidString
            try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: base) }
            let error = #expect(throws: WispError.self) {
                try ToolCatalogue.searchText(roots: Roots([base]), pattern: pattern, path: ".", regex: true, limits: ToolCatalogue.Limits())
            }
            #expect(error?.code == .invalidArgument, "\(pattern)")
            #expect(error?.message.contains(construct) == true, "\(pattern): \(String(describing: error))")
            #expect(error?.message.contains("search_text supports") == true, "\(pattern): \(String(describing: error))")
        }
    }
}
