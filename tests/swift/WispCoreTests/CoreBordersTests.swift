// The core's input borders as a hostile caller meets them: every error text and preview bounded in
// bytes however the input is built, client roots judged as local paths before anything is bound,
// and a fork's error naming the source it was asked about.
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

/// Shapes of text that a bound on Characters would let through whole.
let hostileShapes: [(String, String)] = [
    ("combining marks", "e" + String(repeating: "\u{301}", count: 500_000)),
    ("a ZWJ chain", String(repeating: "\u{1F469}\u{200D}", count: 150_000) + "\u{1F469}"),
    ("ASCII", String(repeating: "a", count: 1_000_000)),
]

@Suite struct CoreBordersTests {
    @Test func noErrorCarriesMoreThanItsBound() {
        for (shape, text) in hostileShapes {
            let e = WispError(.generationFailed, "the server said: " + text)
            #expect(e.message.utf8.count <= WispError.maxMessageBytes, "\(shape)")
            #expect(e.message.hasPrefix("the server said: ") && e.message.hasSuffix(String.cutMark), "\(shape)")
        }
    }

    @Test func aHostileThreadIDIsQuotedBounded() async {
        let registry = ThreadRegistry(backend: EchoBackend())
        for (shape, text) in hostileShapes {
            for (thread, fork) in [(text, nil), (nil, text)] as [(String?, String?)] {
                do {
                    _ = try await registry.accept(threadID: thread, instructions: nil, tools: nil, forkFrom: fork)
                    Issue.record("\(shape) is no thread id")
                } catch {
                    #expect(error.message.hasPrefix(fork == nil ? "thread_id \"" : "fork_from \""), "\(shape)")
                    let size = error.message.utf8.count
                    #expect(size < 2 * String.previewBytes + 200, "\(shape): \(size)")
                }
            }
        }
    }

    @Test func previewsAreBoundedInBytesWhateverTheClusters() {
        for (shape, text) in hostileShapes {
            let turn = Turn(prompt: text, response: text)
            let info = ThreadViews.info(id: "t", instructions: text, history: [turn], pending: 0, live: true,
                                        stored: false, usage: nil, created: nil, updated: nil)
            #expect((info.first_prompt ?? "").utf8.count <= ThreadViews.previewBytes, "\(shape)")
            #expect((info.last_reply ?? "").utf8.count <= ThreadViews.previewBytes, "\(shape)")
            #expect((info.instructions ?? "").utf8.count <= ThreadViews.instructionsBytes, "\(shape)")
            let read = ThreadViews.read(id: "t", instructions: nil, tools: [], history: [turn], condensed: 0, last: nil,
                                        maxBytes: 1000)
            let item = try? #require(read.items.first)
            #expect((item?.prompt.utf8.count ?? 0) + (item?.reply.utf8.count ?? 0) <= 1000, "\(shape)")
            #expect(ThreadSummary(id: "t", turns: 1, createdAt: 0, updatedAt: 0, firstPrompt: text, lastReply: text,
                                  usage: Usage()).firstPrompt.utf8.count <= ThreadSummary.previewLength, "\(shape)")
        }
    }

    @Test func aMatchingLineIsShownBoundedWhateverItsClusters() throws {
        let ws = try Workspace()
        defer { ws.remove() }
        for (shape, text) in hostileShapes {
            try ("before\n" + text + "\nafter\n").write(toFile: ws.root + "/t.txt", atomically: true, encoding: .utf8)
            // A regex: it matches code points, so one scalar finds a line made of one cluster.
            let needle = String(text.unicodeScalars.prefix(1))
            let found = try ToolCatalogue.searchText(roots: Roots([ws.root]), pattern: needle, path: "t.txt",
                                                     regex: true, limits: ToolCatalogue.Limits())
            #expect(found.contains("t.txt:2: ") && found.utf8.count < 1000, "\(shape): \(found.utf8.count) bytes")
        }
    }

    @Test func aHostileReasoningLevelIsQuotedBounded() async throws {
        let (server, wire) = pipeServer(EchoBackend())
        for (k, (shape, text)) in hostileShapes.enumerated() {
            await server.handle(Respond(id: k + 1, prompt: "p", options: RespondOptions(reasoning: text)))
            let reply = await wire.reply(k + 1)
            let message = try #require(reply.body["message"] as? String)
            #expect(!reply.ok && message.hasPrefix("reasoning must be one of"), "\(shape)")
            #expect(message.utf8.count < String.previewBytes + 200, "\(shape): \(message.utf8.count)")
        }
    }
}

@Suite struct ClientRootBordersTests {
    func refusal(_ roots: [String]) async -> WispError? {
        let registry = ThreadRegistry(backend: EchoBackend())
        do {
            let a = try await registry.accept(threadID: "t", instructions: nil, tools: [], roots: roots)
            await registry.finished(a, committed: false)
            return nil
        } catch {
            #expect(await !registry.contains("t"), "a refused root binds nothing")
            return error
        }
    }

    @Test func aRootOverTheSystemsPathLengthIsRefusedNamedAndBounded() async throws {
        let long = "/" + String(repeating: "d", count: Roots.maxPathBytes)
        let e = try #require(await refusal(["/tmp", long]))
        #expect(e.code == .invalidArgument && e.message.contains("is not an absolute local path"), "\(e.message)")
        let over = "\(Roots.maxPathBytes + 1) bytes, over the system's \(Roots.maxPathBytes)"
        #expect(e.message.contains(over), "\(e.message)")
        #expect(e.message.contains("/ddd") && e.message.utf8.count < 600, "\(e.message)")
        // One byte shorter is a path the OS could take: not refused (it need not exist).
        #expect(await refusal(["/tmp", String(long.dropLast())]) == nil)
    }

    @Test(arguments: [("relative/dir", "does not start with"), ("", "does not start with"),
                      ("~/x", "does not start with"), ("/tmp/x\u{0}y", "NUL byte"),
                      ("\u{301}/tmp", "does not start with")])
    func aRootThatIsNoLocalPathSaysWhy(_ root: String, _ why: String) async throws {
        let e = try #require(await refusal(["/tmp", root]))
        #expect(e.message.contains(root.debugDescription) && e.message.contains(why), "\(e.message)")
        #expect(e.message.contains("fix that root in the client"), "\(e.message)")
    }

    @Test func aHostileRootIsQuotedBounded() async throws {
        for (shape, text) in hostileShapes {
            for root in [text, "/" + text + "\u{0}"] {
                let e = try #require(await refusal([root]), "\(shape)")
                #expect(e.message.utf8.count < 1200, "\(shape): \(e.message.utf8.count)")
            }
        }
    }

    @Test func moreRootsThanTheLimitAreRefusedWhoeverCountsThem() async throws {
        let e = try #require(await refusal(Array(repeating: "/tmp", count: ThreadRegistry.maxRoots + 1)))
        #expect(e.message.contains("more than \(ThreadRegistry.maxRoots) roots"), "\(e.message)")
        #expect(await refusal(Array(repeating: "/tmp", count: ThreadRegistry.maxRoots)) == nil)
    }
}

@Suite struct ForkErrorTests {
    @Test(arguments: ["no-such-thread", "closed-one"])
    func aForkOfAThreadThatIsNotThereNamesIt(_ source: String) async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        try await call(registry, "closed-one", "hi")
        _ = try await registry.close("closed-one")
        do {
            _ = try await registry.accept(threadID: nil, instructions: nil, tools: nil, forkFrom: source)
            Issue.record("\(source) cannot be forked")
        } catch {
            #expect(error.code == .invalidArgument && error.message.contains("'\(source)'"), "\(error.message)")
        }
    }

    @Test func aMalformedSourceIsNamedAsFork_from() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        do {
            _ = try await registry.accept(threadID: "new", instructions: nil, tools: nil, forkFrom: "bad id/..")
            Issue.record("a malformed source cannot be forked")
        } catch {
            #expect(error.message.hasPrefix("fork_from \"bad id/..\" is not valid"), "\(error.message)")
        }
    }
}
