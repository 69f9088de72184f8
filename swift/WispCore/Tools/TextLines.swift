/// The lines of a text, as wisp numbers them for the model and the caller (read_file's ranges
/// and counts, search_text's `file:line:`, an attached file's first line in the echo backend).
///
/// A line ends at LF, at CRLF or at a lone CR, as editors count them; the ending is not part of
/// the line, and an ending at the very end of the text starts no further line (so "a\n" is one
/// line, and "" none). In a file with LF or CRLF endings the numbers are `grep -n`'s; grep ends
/// lines at LF only, so in a file of lone CRs (classic Mac OS) it sees one line where editors,
/// and wisp, see several.
///
/// Bytes, not `Character`s: Swift takes "\r\n" for one Character, which `split(separator: "\n")`
/// never matches, so a CRLF file came out as a single line.
enum TextLines {
    static func split(_ text: String) -> [Substring] {
        var lines: [Substring] = []
        var rest = text[...]
        while let (line, after) = next(rest) {
            lines.append(line)
            rest = after
        }
        return lines
    }

    /// The first line ("" for an empty text).
    static func first(_ text: String) -> Substring {
        next(text[...])?.line ?? ""
    }

    /// Whether the text's last line has its ending (an empty text has none to end).
    static func endsWithLineBreak(_ text: String) -> Bool {
        text.utf8.last == UInt8(ascii: "\n") || text.utf8.last == UInt8(ascii: "\r")
    }

    /// The line `text` starts with and what follows its ending; nil for an empty text.
    private static func next(_ text: Substring) -> (line: Substring, after: Substring)? {
        let bytes = text.utf8
        guard !bytes.isEmpty else { return nil }
        guard let end = bytes.firstIndex(where: { $0 == UInt8(ascii: "\n") || $0 == UInt8(ascii: "\r") }) else {
            return (text, text[text.endIndex...])
        }
        var after = bytes.index(after: end)
        if bytes[end] == UInt8(ascii: "\r"), after < bytes.endIndex, bytes[after] == UInt8(ascii: "\n") {
            after = bytes.index(after: after)
        }
        return (text[..<end], text[after...])
    }
}
