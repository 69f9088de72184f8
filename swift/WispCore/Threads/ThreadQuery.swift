#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// What a word is and how its case folds, for `list_threads`' search: one judgement, made here in
/// Swift, that live threads and every store apply. A store keeps each turn's words as `of` gives
/// them and matches a query's words against them byte for byte, so a query finds the same
/// threads live and stored, whatever the script.
public enum SearchWords {
    /// The words of `text`, folded, in order, repeats kept.
    ///
    /// - Folding: upper case, then lower case (ß and SS fold together, as do ς σ Σ and ﬁ fi; İ
    ///   folds to i + U+0307, so it is not the plain i), then NFC, so that canonically equivalent
    ///   spellings (é and e + U+0301) are one word byte for byte. No locale; accents count (é is
    ///   not e).
    /// - A word: a run of letters and digits. A Han ideograph or a kana is a word on its own,
    ///   since those scripts put no spaces between words. Anything else separates: spaces,
    ///   punctuation, symbols, emoji; so does a character holding any ASCII byte but a letter or
    ///   digit, so that no word holds one (the SQLite index splits on them).
    /// Unicode's canonical composition (NFC): FoundationEssentials has no
    /// `precomposedStringWithCanonicalMapping`; the standard library's normalizer is the same table.
    static func composed(_ text: String) -> String {
        #if canImport(FoundationEssentials) && !canImport(Darwin)
        String(decoding: Array(text._nfcCodeUnits), as: UTF8.self)
        #else
        text.precomposedStringWithCanonicalMapping
        #endif
    }

    public static func of(_ text: String) -> [String] {
        let folded = Self.composed(text.uppercased().lowercased())
        var words: [String] = []
        var start: String.Index?
        var i = folded.startIndex
        while i < folded.endIndex {
            let next = folded.index(after: i)
            let c = folded[i]
            if let s = start, !inWord(c) || standsAlone(c) {
                words.append(String(folded[s..<i]))
                start = nil
            }
            if standsAlone(c) {
                words.append(String(c))
            } else if inWord(c), start == nil {
                start = i
            }
            i = next
        }
        if let s = start { words.append(String(folded[s...])) }
        return words
    }

    /// `of(text)` once each, in order of first use: what a store keeps of a turn.
    public static func distinct(_ text: String) -> [String] {
        var seen = Set<String>()
        return of(text).filter { seen.insert($0).inserted }
    }

    private static func inWord(_ c: Character) -> Bool {
        (c.isLetter || c.isNumber) && !c.unicodeScalars.contains { $0.isASCII && !isASCIIWordByte($0) }
    }

    private static func isASCIIWordByte(_ s: Unicode.Scalar) -> Bool {
        ("a"..."z").contains(s) || ("A"..."Z").contains(s) || ("0"..."9").contains(s)
    }

    private static func standsAlone(_ c: Character) -> Bool {
        guard let s = c.unicodeScalars.first, inWord(c) else { return false }
        // Hiragana and katakana (with their half-width forms) beside the ideographs.
        return s.properties.isIdeographic || (0x3040...0x30FF).contains(s.value) || (0xFF66...0xFF9D).contains(s.value)
    }
}

/// The words of a `list_threads` query (`SearchWords`), matched as whole words over a thread's
/// prompts and replies: a thread matches when it holds every word, and scores the number of
/// times they occur.
public struct ThreadQuery: Sendable, Equatable {
    public let words: Set<String>
    /// Longer queries are refused: they are not what a person searches with. In UTF-8 bytes, the
    /// unit the core holds text in; the shim checks no length of its own (the core's facts state it).
    public static let maxBytes = 1000

    public init(_ text: String) throws(WispError) {
        guard text.utf8.count <= Self.maxBytes else {
            throw WispError(.invalidArgument, "query is \(text.utf8.count) bytes of UTF-8; at most "
                                              + "\(Self.maxBytes) bytes: search with fewer words")
        }
        words = Set(SearchWords.of(text))
        guard !words.isEmpty else {
            throw WispError(.invalidArgument, "query has no words to search for (a word is letters or digits)")
        }
    }

    /// How well `history` matches: nil when some word is missing.
    public func score(_ history: [Turn]) -> Int? {
        var counts: [String: Int] = [:]
        for turn in history {
            for text in [turn.prompt, turn.response] {
                for word in SearchWords.of(text) where words.contains(word) {
                    counts[word, default: 0] += 1
                }
            }
        }
        guard counts.count == words.count else { return nil }
        return counts.values.reduce(0, +)
    }

    public func matches(_ history: [Turn]) -> Bool { score(history) != nil }
}
