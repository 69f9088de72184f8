// Lines end at LF, CRLF or a lone CR (Tools/TextLines.swift): the same text with each ending
// has the same lines and numbers in read_file, search_text and an attached file.
import Foundation
import Testing
@testable import WispCore

@Suite struct LineEndings {
    static let endings = [("LF", "\n"), ("CRLF", "\r\n"), ("CR", "\r")]

    /// 300 lines, "line 1" … "line 300", each ended by `ending`.
    static func text(_ ending: String) -> String {
        (1...300).map { "line \($0)" }.joined(separator: ending) + ending
    }

    @Test func textLinesSplitsAtEachEndingAndNotAfterTheLast() {
        #expect(TextLines.split("") == [])
        #expect(TextLines.split("a") == ["a"])
        #expect(TextLines.split("a\n") == ["a"])
        #expect(TextLines.split("a\r\nb\rc\n\nd") == ["a", "b", "c", "", "d"])
        #expect(TextLines.split("a\n\r") == ["a", ""], "LF then CR is two endings: CRLF is one only in that order")
        #expect(TextLines.split("é\r\n\u{301}x") == ["é", "\u{301}x"], "bytes: a combining mark after CRLF starts the next line")
        #expect(TextLines.first("a\r\nb") == "a")
        #expect(TextLines.endsWithLineBreak("a\r") && TextLines.endsWithLineBreak("a\r\n") && !TextLines.endsWithLineBreak("a"))
    }

    @Test(arguments: endings)
    func readFileCountsAndShowsLines(_ name: String, _ ending: String) throws {
        let ws = try Workspace()
        defer { ws.remove() }
        try Self.text(ending).write(toFile: ws.root + "/t.txt", atomically: true, encoding: .utf8)
        let roots = Roots([ws.root])
        let limits = ToolCatalogue.Limits()
        let range = try ToolCatalogue.readFile(roots: roots, path: "t.txt", start: 250, end: 251, limits: limits)
        #expect(range == "line 250\nline 251\n", "\(name)")
        do {
            _ = try ToolCatalogue.readFile(roots: roots, path: "t.txt", start: 301, end: nil, limits: limits)
            Issue.record("\(name): start_line 301 of 300 lines was taken")
        } catch {
            #expect(error.message.contains("has 300 lines"), "\(name): \(error.message)")
        }
    }

    @Test(arguments: endings)
    func searchTextNumbersLines(_ name: String, _ ending: String) throws {
        let ws = try Workspace()
        defer { ws.remove() }
        try Self.text(ending).write(toFile: ws.root + "/t.txt", atomically: true, encoding: .utf8)
        let found = try ToolCatalogue.searchText(roots: Roots([ws.root]), pattern: "line 250", path: "t.txt", regex: false,
                                                 limits: ToolCatalogue.Limits())
        #expect(found.hasSuffix(":250: line 250"), "\(name): \(found)")
        let anchored = try ToolCatalogue.searchText(roots: Roots([ws.root]), pattern: "^line 25$", path: "t.txt", regex: true,
                                                    limits: ToolCatalogue.Limits())
        #expect(anchored.hasSuffix(":25: line 25"), "\(name): the ending is not part of the line: \(anchored)")
    }

    @Test(arguments: endings)
    func anAttachedFilesFirstLine(_ name: String, _ ending: String) async throws {
        let ws = try Workspace()
        defer { ws.remove() }
        try Self.text(ending).write(toFile: ws.root + "/t.txt", atomically: true, encoding: .utf8)
        let conversation = Conversation(backend: EchoBackend(contextSize: 8192), instructions: nil, tools: [])
        let files = FileRequest(paths: ["t.txt"], roots: Roots([ws.root]))
        let staged = try await conversation.respond(to: "look", files: files, settings: .init(), onPartial: nil)
        #expect(staged.text == "echo 1: look\nfile t.txt: line 1", "\(name)")
        let turn = conversation.commit(staged)
        #expect(turn.turns == 1)
        let block = AttachedFile(path: "t.txt", text: Self.text(ending)).block
        #expect(block.hasSuffix(ending + "</file>"), "\(name): a text that ends its last line gets no extra one")
    }
}
