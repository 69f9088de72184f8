import Foundation
import Testing
@testable import WispCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A root named `café` (NFC) beside `cafe\u{301}` (NFD) with a secret: two directories to
/// Linux, one name to Swift's `String` `==`. Every judgement on a path must be by bytes.
struct UnicodeSiblings {
    let base: String
    let nfc: String
    let nfd: String

    /// Nil where the file system takes the two names for one (APFS and HFS+ on macOS do).
    init?() throws {
        base = NSTemporaryDirectory() + "wisp-bytes-" + UUID().uuidString
        nfc = base + "/caf\u{E9}"
        nfd = base + "/cafe\u{301}"
        let fm = FileManager.default
        try fm.createDirectory(atPath: nfc, withIntermediateDirectories: true)
        guard mkdir(nfd, 0o700) == 0 else {
            try? fm.removeItem(atPath: base)
            return nil
        }
        try "inside\n".write(toFile: nfc + "/secret.txt", atomically: false, encoding: .utf8)
        try "nfd secret\n".write(toFile: nfd + "/secret.txt", atomically: false, encoding: .utf8)
        // A name beginning with a combining mark: after a "/", Swift's `split` sees no separator.
        try "combining secret\n".write(toFile: base + "/\u{301}secret.txt", atomically: false, encoding: .utf8)
        // A dot-file whose dot a combining mark follows: a dot-file by its bytes.
        try "hidden nfd secret\n".write(toFile: nfc + "/.\u{301}hidden.txt", atomically: false, encoding: .utf8)
    }

    func remove() { try? FileManager.default.removeItem(atPath: base) }

    func tool(_ name: String, roots: [String]? = nil) -> ModelTool {
        ToolCatalogue.tools(roots: Roots(roots ?? [nfc])).first { $0.name == name }!
    }
}

private func json(_ object: [String: String]) -> String {
    String(decoding: try! JSONSerialization.data(withJSONObject: object), as: UTF8.self)
}

@Suite struct PathsAreBytes {
    @Test func theNFDSiblingOfAnNFCRootIsOutside() async throws {
        guard let ws = try UnicodeSiblings() else { return }
        defer { ws.remove() }
        let sibling = "../cafe\u{301}/secret.txt"
        do {
            let out = try await ws.tool("read_file").call(json(["path": sibling]))
            Issue.record("read_file read the sibling: \(out)")
        } catch let e as WispError {
            #expect(e.code == .invalidArgument && e.message.contains("outside the readable roots"), "\(e.message)")
        }
        do {
            let out = try await ws.tool("list_directory").call(json(["path": "../cafe\u{301}"]))
            Issue.record("list_directory listed the sibling: \(out)")
        } catch let e as WispError {
            #expect(e.message.contains("outside the readable roots"), "\(e.message)")
        }
        do {
            let out = try await ws.tool("search_text").call(json(["pattern": "secret", "path": "../cafe\u{301}"]))
            Issue.record("search_text searched the sibling: \(out)")
        } catch let e as WispError {
            #expect(e.message.contains("outside the readable roots"), "\(e.message)")
        }
        let files = FileRequest(paths: [sibling], roots: Roots([ws.nfc]))
        #expect(throws: WispError.self) { _ = try FileAttachments.read(files, context: 4096) }
    }

    @Test func anAbsoluteNFDPathNeverResolvesToTheNFCRootsFile() async throws {
        guard let ws = try UnicodeSiblings() else { return }
        defer { ws.remove() }
        do {
            let out = try await ws.tool("read_file").call(json(["path": ws.nfd + "/secret.txt"]))
            Issue.record("an NFD path read \(out.debugDescription)")
        } catch let e as WispError {
            #expect(e.message.contains("outside the readable roots"), "\(e.message)")
        }
        // The NFC path itself reads the NFC root's own file.
        #expect(try await ws.tool("read_file").call(json(["path": ws.nfc + "/secret.txt"])) == "inside\n")
    }

    @Test func rootsThatDifferOnlyInNormalisationAreTwoRoots() async throws {
        guard let ws = try UnicodeSiblings() else { return }
        defer { ws.remove() }
        let both = Roots([ws.nfc, ws.nfd])
        #expect(both.paths.count == 2)
        // Each root's file is its own.
        let read = ws.tool("read_file", roots: [ws.nfc, ws.nfd])
        #expect(try await read.call(json(["path": ws.nfd + "/secret.txt"])) == "nfd secret\n")
        #expect(try await read.call(json(["path": ws.nfc + "/secret.txt"])) == "inside\n")
    }

    @Test func aSlashFollowedByACombiningMarkStillSeparates() async throws {
        guard let ws = try UnicodeSiblings() else { return }
        defer { ws.remove() }
        // To `String.split` "/\u{301}" is one character, not a "/": the whole path was one
        // component, and the kernel's own walk of it left the root.
        do {
            let out = try await ws.tool("read_file").call(json(["path": "../\u{301}secret.txt"]))
            Issue.record("read outside through a combining slash: \(out.debugDescription)")
        } catch let e as WispError {
            #expect(e.message.contains("outside the readable roots"), "\(e.message)")
        }
        let files = FileRequest(paths: ["../\u{301}secret.txt"], roots: Roots([ws.nfc]))
        #expect(throws: WispError.self) { _ = try FileAttachments.read(files, context: 4096) }
    }

    @Test func dotFilesAreSkippedByTheirBytes() async throws {
        guard let ws = try UnicodeSiblings() else { return }
        defer { ws.remove() }
        let found = try await ws.tool("search_text").call(json(["pattern": "i"]))
        #expect(found == "secret.txt:1: inside", "\(found)")
    }

    #if os(Linux)
    /// Names that are not UTF-8 (Linux allows any bytes but "/" and NUL) are read by their bytes,
    /// not by a repaired copy of them.
    @Test func namesThatAreNotUTF8AreSearchedByTheirBytes() async throws {
        let base = NSTemporaryDirectory() + "wisp-bytes-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: base) }
        var name = Array((base + "/bad").utf8)
        name.append(0xFF)
        name.append(0)
        let fd = name.withUnsafeBufferPointer { b in b.withMemoryRebound(to: CChar.self) { open($0.baseAddress!, O_WRONLY | O_CREAT, 0o600) } }
        try #require(fd >= 0)
        _ = write(fd, "needle\n", 7)
        close(fd)
        let found = try await ToolCatalogue.tools(roots: Roots([base])).first { $0.name == "search_text" }!.call(json(["pattern": "needle"]))
        #expect(found == "bad\u{FFFD}:1: needle", "\(found)")
    }
    #endif
}

@Suite struct RootSeparatorsAreBytes {
    @Test func aCombiningMarkAfterASeparatorDoesNotHideIt() throws {
        // WISP_ROOTS splits at ":" bytes, --root=DIR at the first "=" byte, whatever follows them.
        let env = try CoreConfig.parse(arguments: [], environment: ["WISP_ROOTS": "/a:\u{301}b"])
        #expect(env.roots.map { Array($0.utf8) } == [Array("/a".utf8), Array("\u{301}b".utf8)])
        let flag = try CoreConfig.parse(arguments: ["--root=\u{301}dir"], environment: [:])
        #expect(flag.roots.map { Array($0.utf8) } == [Array("\u{301}dir".utf8)])
    }

    @Test func aClientRootIsAbsoluteByItsFirstByte() throws {
        try ThreadRegistry.validate(roots: ["/\u{301}dir"])
        #expect(throws: WispError.self) { try ThreadRegistry.validate(roots: ["\u{301}/dir"]) }
    }
}

/// A crafted path is bounded as the OS bounds one, walked in linear time, quoted
/// short, and stops when its call does.
@Suite struct CraftedPaths {
    static func workspace() throws -> String {
        let base = NSTemporaryDirectory() + "wisp-crafted-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: base + "/sub", withIntermediateDirectories: true)
        try "text\n".write(toFile: base + "/a.txt", atomically: false, encoding: .utf8)
        return base
    }

    @Test func aPathOverPATHMAXIsRefusedQuotingAShortPrefix() throws {
        let base = try Self.workspace()
        defer { try? FileManager.default.removeItem(atPath: base) }
        let crafted = Array(repeating: "sub/..", count: 60_000).joined(separator: "/") + String(repeating: "/.", count: 60_000)
        do {
            _ = try Roots([base]).open(crafted)
            Issue.record("a 540 KB path was walked")
        } catch {
            #expect(error.code == .invalidArgument && error.message.contains("PATH_MAX"), "\(error.message.prefix(300))")
            #expect(error.message.utf8.count < 400, "\(error.message.utf8.count) bytes")
        }
        // Just under the limit it is walked, to the file.
        let n = (Roots.maxPathBytes - "a.txt".utf8.count) / "sub/../".utf8.count
        let long = String(repeating: "sub/../", count: n) + "a.txt"
        #expect(long.utf8.count <= Roots.maxPathBytes)
        #expect(try Roots([base]).open(long).isDirectory == false)
    }

    @Test func symlinksCannotMultiplyTheWalkPastItsBound() throws {
        let base = try Self.workspace()
        defer { try? FileManager.default.removeItem(atPath: base) }
        // Each link's target is as many `sub/..` pairs as fit in a symlink, then the next link.
        let pairs = (Roots.maxPathBytes - 16) / "sub/../".utf8.count
        let links = Roots.maxComponents / (2 * pairs) + 2
        let hop = String(repeating: "sub/../", count: pairs)
        for i in 0..<links {
            try FileManager.default.createSymbolicLink(atPath: base + "/l\(i)", withDestinationPath: hop + (i == links - 1 ? "a.txt" : "l\(i + 1)"))
        }
        #expect(try Roots([base]).open("l\(links - 2)").isDirectory == false)
        do {
            _ = try Roots([base]).open("l0")
            Issue.record("\(links * 2 * pairs) steps were walked")
        } catch {
            #expect(error.message.contains("path components"), "\(error.message)")
        }
    }

    @Test func aCancelledCallStopsTheWalkAndTheRead() async throws {
        let base = try Self.workspace()
        defer { try? FileManager.default.removeItem(atPath: base) }
        let roots = Roots([base])
        let walk = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return Result { () throws(WispError) in try roots.open("sub/../a.txt").isDirectory }
        }
        guard case .failure(let e) = await walk.value else { Issue.record("a cancelled call's walk went on"); return }
        #expect(e.code == .cancelled)
        let files = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return Result { () throws(WispError) in try FileAttachments.read(FileRequest(paths: ["a.txt"], roots: roots), context: 4096).count }
        }
        guard case .failure(let f) = await files.value else { Issue.record("a cancelled call's files were read"); return }
        #expect(f.code == .cancelled)
    }
}
