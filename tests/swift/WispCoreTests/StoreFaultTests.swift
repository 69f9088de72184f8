// A store that hangs under one thread stalls no call on another.
import Dispatch
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A pipe loop on an OS thread of its own (it runs for the rest of the process), reading a pipe
/// nobody writes to: where the pipe server's calls run, as in the core.
private func pipeLoop() -> PipeLoop {
    let loop = PipeLoop()
    var fds: [Int32] = [-1, -1]
    precondition(pipe(&fds) == 0)
    let input = fds[0]
    Thread.detachNewThread { loop.run(input: input) { _ in } }
    return loop
}

extension WholePool {
@Suite struct StoreOffThePipe {
    /// A hung store (a simulated one: the memory store's `beforeLease` fault waits) under one
    /// thread stalls no call on another. Its reply comes while the hung call is still hung.
    @Test func aHungLeaseStallsNoCallOnAnotherThread() async throws {
        let hung = Gate()
        let store = MemoryThreadStore(faults: .init(beforeLease: { id in
            if id == "hung" { await hung.pass() }
        }))
        let loop = pipeLoop()
        let wire = Wire()
        let backend = EchoBackend()
        let server = PipeServer(registry: ThreadRegistry(backend: backend, store: store), backend: backend, log: Log(level: .error),
                                executor: loop) { wire.send($0) }
        await Task(executorPreference: loop) { await server.handle(Respond(id: 1, prompt: "hi", thread_id: "hung")) }.value
        // Not awaited: on a stalled loop the request would not even be taken.
        Task(executorPreference: loop) { await server.handle(Respond(id: 2, prompt: "hi", thread_id: "other")) }
        let other = await wire.reply(2)
        let hungAnswered = await wire.replyIndex(1, within: .zero) != nil
        hung.open()
        #expect(other.ok && other.body["text"] as? String == "echo 1: hi")
        #expect(!hungAnswered)
        #expect(await wire.reply(1).ok)
    }

    /// 25.4: a client's roots are not resolved (realpath, stat) while the registry accepts the
    /// call on the pipe loop, but at the first tool call, which runs off it: a root that
    /// appears between the two is read.
    @Test func clientRootsAreResolvedAtTheToolCallNotAtAccept() async throws {
        let base = NSTemporaryDirectory() + "wisp-lazy-roots-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: base + "/own", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: base) }
        let own = Roots([base + "/own"])
        let registry = ThreadRegistry(backend: EchoBackend(), tools: ToolCatalogue.tools(roots: own),
                                      toolsWithRoots: { extra in ToolCatalogue.tools(roots: own, adding: extra) })
        let later = base + "/client"
        let a = try await registry.accept(threadID: "t", instructions: nil, tools: ["read_file"], roots: [later])
        try FileManager.default.createDirectory(atPath: later, withIntermediateDirectories: true)
        try "from the client\n".write(toFile: later + "/x.txt", atomically: false, encoding: .utf8)
        let o = try await a.thread.respond(a.ticket, prompt: #"!tool read_file {"path": "\#(later)/x.txt"}"#, settings: .init(), onPartial: nil)
        await registry.finished(a, committed: true)
        #expect(o.text == "echo 1: tool read_file -> from the client\n")
    }
}
}
