import Foundation
import Testing
@testable import WispCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A scratch workspace with an outside neighbour to escape to.
struct Workspace {
    let base: String
    let root: String

    init() throws {
        base = NSTemporaryDirectory() + "wisp-tools-" + UUID().uuidString
        root = base + "/root"
        let fm = FileManager.default
        try fm.createDirectory(atPath: root + "/sub", withIntermediateDirectories: true)
        try "secret\n".write(toFile: base + "/outside.txt", atomically: true, encoding: .utf8)
        try "line one\nline two\nneedle here\n".write(toFile: root + "/a.txt", atomically: true, encoding: .utf8)
        try "deep needle\n".write(toFile: root + "/sub/b.txt", atomically: true, encoding: .utf8)
        try fm.createSymbolicLink(atPath: root + "/escape", withDestinationPath: base + "/outside.txt")
        try fm.createSymbolicLink(atPath: root + "/inside-link", withDestinationPath: root + "/a.txt")
        try fm.createSymbolicLink(atPath: root + "/loop1", withDestinationPath: root + "/loop2")
        try fm.createSymbolicLink(atPath: root + "/loop2", withDestinationPath: root + "/loop1")
        mkfifo(root + "/fifo", 0o600)
        try Data([0x7F, 0x45, 0x4C, 0x46, 0, 1, 2, 0]).write(to: URL(fileURLWithPath: root + "/binary.bin"))
        try Data(repeating: UInt8(ascii: "x"), count: 3_000_000).write(to: URL(fileURLWithPath: root + "/huge.txt"))
        // A second name, inside the root, for a file outside it.
        try "linked secret\n".write(toFile: base + "/linked.txt", atomically: true, encoding: .utf8)
        try fm.linkItem(atPath: base + "/linked.txt", toPath: root + "/sub/hardlink")
    }

    /// The base directory's own name, for a `..` chain that climbs out and back into it.
    var baseName: String { (base as NSString).lastPathComponent }

    /// With a scan time limit far above any run's: these tests check what is found, and the time
    /// limit has tests of its own.
    func tool(_ name: String, allowHardLinks: Bool = false) -> ModelTool {
        var limits = ToolCatalogue.Limits()
        limits.maxScanSeconds = 600
        return ToolCatalogue.tools(roots: Roots([root], allowHardLinks: allowHardLinks), limits: limits)
            .first { $0.name == name }!
    }

    func remove() { try? FileManager.default.removeItem(atPath: base) }
}

@Suite(.serialized) struct ModelTools {
    /// Every path here is one the workspace made, so the table means the same on Linux and macOS.
    static func escapes(_ ws: Workspace) -> [(String, String, String)] {
        var table: [(String, String, String)] = [
            ("dotdot chain", #"{"path": "../outside.txt"}"#, "outside the readable roots"),
            ("long dotdot chain", #"{"path": "sub/../../../\#(ws.baseName)/root/sub/../../outside.txt"}"#, "outside the readable roots"),
            ("absolute outside", #"{"path": "\#(ws.base)/outside.txt"}"#, "outside the readable roots"),
            ("symlink pointing out", #"{"path": "escape"}"#, "outside the readable roots"),
            ("hard link to an outside file", #"{"path": "sub/hardlink"}"#, "--allow-hardlinks"),
            ("symlink loop", #"{"path": "loop1"}"#, "no such file"),
            ("dev zero", #"{"path": "/dev/zero"}"#, "outside the readable roots"),
            ("fifo", #"{"path": "fifo"}"#, "not a regular file"),
            ("nul byte", #"{"path": "a.txt\u0000.png"}"#, "NUL"),
            ("directory", #"{"path": "sub"}"#, "is a directory"),
            ("binary", #"{"path": "binary.bin"}"#, "binary"),
            ("missing", #"{"path": "nope.txt"}"#, "no such file"),
            ("not an object", #"["a.txt"]"#, "JSON object"),
            ("wrong type", #"{"path": 7}"#, "must be a string"),
            ("bool for a line", #"{"path": "a.txt", "start_line": true}"#, "must be a whole number"),
        ]
        #if os(Linux)
        table.append(("proc self", #"{"path": "/proc/self/environ"}"#, "outside the readable roots"))
        table.append(("proc root link", #"{"path": "/proc/self/root/etc/passwd"}"#, "outside the readable roots"))
        #endif
        return table
    }

    @Test func escapesAreRefusedWithClearMessages() async throws {
        let ws = try Workspace()
        defer { ws.remove() }
        let read = ws.tool("read_file")
        for (name, arguments, message) in Self.escapes(ws) {
            let clock = ContinuousClock()
            let start = clock.now
            do {
                let out = try await read.call(arguments)
                Issue.record("\(name): expected a refusal, got \(out.prefix(80))")
            } catch let e as WispError {
                #expect(e.code == .invalidArgument, "\(name)")
                #expect(e.message.contains(message), "\(name): \(e.message)")
            }
            // A blocking open (a FIFO, a device) would never return: any bound far above a refusal's time will do.
            #expect(seconds(clock.now - start) < 10, "\(name) must not block")
        }
    }

    @Test func hardLinksAreReadOnlyWhenAllowed() async throws {
        let ws = try Workspace()
        defer { ws.remove() }
        #expect(try await ws.tool("read_file", allowHardLinks: true).call(#"{"path": "sub/hardlink"}"#) == "linked secret\n")
        let refused = try await ws.tool("search_text").call(#"{"pattern": "secret", "path": "sub"}"#)
        #expect(refused.hasPrefix("no matches") && refused.contains("1 hard-linked"))
        #expect(try await ws.tool("search_text", allowHardLinks: true).call(#"{"pattern": "secret", "path": "sub"}"#) == "sub/hardlink:1: linked secret")
    }

    @Test func devicesInsideARootAreRefusedWithoutBlocking() async throws {
        let read = ToolCatalogue.tools(roots: Roots(["/dev"])).first { $0.name == "read_file" }!
        for device in ["zero", "null", "urandom"] {
            await #expect(throws: WispError.self) { try await read.call(#"{"path": "\#(device)"}"#) }
        }
    }

    @Test func readsTextWithinRootsAndCapsHugeFiles() async throws {
        let ws = try Workspace()
        defer { ws.remove() }
        let read = ws.tool("read_file")
        #expect(try await read.call(#"{"path": "a.txt"}"#) == "line one\nline two\nneedle here\n")
        #expect(try await read.call(#"{"path": "inside-link", "start_line": 2, "end_line": 2}"#) == "line two\n")
        #expect(try await read.call(#"{"path": "\#(ws.root)/sub/b.txt"}"#) == "deep needle\n")
        let huge = try await read.call(#"{"path": "huge.txt"}"#)
        #expect(huge.utf8.count < 7_000)
        #expect(huge.contains("[file continues") || huge.contains("[cut at"))
    }

    @Test func listsAndSearches() async throws {
        let ws = try Workspace()
        defer { ws.remove() }
        let list = try await ws.tool("list_directory").call(#"{"path": "."}"#)
        #expect(list.split(separator: "\n").contains("sub/"))
        #expect(list.contains("a.txt"))
        await #expect(throws: WispError.self) { try await ws.tool("list_directory").call(#"{"path": ".."}"#) }
        let search = ws.tool("search_text")
        let found = try await search.call(#"{"pattern": "needle"}"#)
        #expect(found.split(separator: "\n").filter { !$0.contains("hard-linked") }.sorted() == ["a.txt:3: needle here", "sub/b.txt:1: deep needle"])
        // Symlinks are not followed while walking, so the escape link is never read (nor the hard link).
        #expect(try await search.call(#"{"pattern": "secret"}"#).hasPrefix("no matches"))
        #expect(try await search.call(#"{"pattern": "ne+dle h", "regex": true, "path": "a.txt"}"#) == "a.txt:3: needle here")
        await #expect(throws: WispError.self) { try await search.call(#"{"pattern": "(", "regex": true}"#) }
        await #expect(throws: WispError.self) { try await search.call(#"{"pattern": "x", "path": "/etc"}"#) }
    }

    @Test func echoToolDirectiveCallsOnlyBoundTools() async throws {
        let ws = try Workspace()
        defer { ws.remove() }
        let registry = ThreadRegistry(backend: EchoBackend(), tools: ToolCatalogue.tools(roots: Roots([ws.root])))
        try await call(registry, "t", "hi", tools: ["read_file"])
        let ok = try await call(registry, "t", #"!tool read_file {"path": "a.txt", "end_line": 1}"#)
        #expect(ok.outcome.text == "echo 2: tool read_file -> line one\n")
        let refused = try await call(registry, "t", #"!tool read_file {"path": "../outside.txt"}"#)
        #expect(refused.outcome.text.hasPrefix("echo 3: tool read_file failed: ../outside.txt: outside the readable roots"))
        let unbound = try await call(registry, "t", #"!tool list_directory {"path": "."}"#)
        #expect(unbound.outcome.text == "echo 4: tool list_directory failed: tool 'list_directory' is not bound to this thread; bound: read_file")
        // The tool call and output are part of the turn, counted as a whole.
        let thread = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let history = await thread.thread.history
        #expect(history[1].toolExchanges.count == 1 && history[1].toolExchanges[0].output == "line one\n")
        _ = try await thread.thread.respond(thread.ticket, prompt: "x", settings: .init(), onPartial: nil)
    }
}

@Suite struct ClientRoots {
    @Test func aThreadCreatedWithClientRootsMayReadThemOthersMayNot() async throws {
        let ws = try Workspace()
        defer { ws.remove() }
        let base = Roots([ws.root])
        let registry = ThreadRegistry(backend: EchoBackend(), tools: ToolCatalogue.tools(roots: base),
                                      toolsWithRoots: { extra in ToolCatalogue.tools(roots: Roots(base.paths + extra)) })
        let outside = #"!tool read_file {"path": "\#(ws.base)/outside.txt"}"#
        let a = try await registry.accept(threadID: "with", instructions: nil, tools: ["read_file"], roots: [ws.base])
        _ = try await a.thread.respond(a.ticket, prompt: "hi", settings: .init(), onPartial: nil)
        await registry.finished(a, committed: true)
        #expect(try await call(registry, "with", outside).outcome.text == "echo 2: tool read_file -> secret\n")
        try await call(registry, "without", "hi", tools: ["read_file"])
        #expect(try await call(registry, "without", outside).outcome.text.contains("outside the readable roots"))
    }
}

@Suite struct ToolSchemas {
    @Test func everyCatalogueSchemaIsAClosedObjectWhoseRequiredKeysAreProperties() throws {
        for tool in ToolCatalogue.tools(roots: Roots([FileManager.default.temporaryDirectory.path])) {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(tool.parametersSchema.utf8)) as? [String: Any], "\(tool.name)")
            let properties = try #require(object["properties"] as? [String: [String: Any]], "\(tool.name)")
            #expect(object["type"] as? String == "object")
            #expect(object["additionalProperties"] as? Bool == false)
            #expect(Set(object["required"] as? [String] ?? ["?"]).isSubset(of: properties.keys), "\(tool.name)")
            #expect(properties.values.allSatisfy { ["string", "integer", "boolean"].contains($0["type"] as? String ?? "") })
        }
    }

    @Test func descriptionsAreEscapedAsJSON() throws {
        let schema = ToolSchema(properties: [.string("q\"uote", "a \"b\"\\c\nd\u{1}"), .integer("n", minimum: 2)], required: ["n"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(schema.json.utf8)) as? [String: Any])
        let properties = try #require(object["properties"] as? [String: [String: Any]])
        #expect(properties["q\"uote"]?["description"] as? String == "a \"b\"\\c\nd\u{1}")
        #expect(properties["n"]?["minimum"] as? Int == 2)
        #expect(object["required"] as? [String] == ["n"])
    }
}
