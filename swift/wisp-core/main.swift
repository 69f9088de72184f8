// wisp-core: the child process the shim starts. Frames in on stdin, frames out on stdout,
// logs on stderr. It exits 0 at stdin EOF (after stopping calls in flight, waiting for them at
// most 2 s), 64 on bad flags, 65 on a frame it cannot decode (the shim then restarts it), 70 on
// the echo `!crash`.
import Foundation
import Synchronization
import WispCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// A shim that went away must not kill us with SIGPIPE mid-write; EPIPE ends the process cleanly instead.
signal(SIGPIPE, SIG_IGN)

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.contains("--help") || arguments.contains("-h") {
    FileHandle.standardError.write(Data((CoreConfig.usage + "\n").utf8))
    exit(0)
}
let config: CoreConfig
do {
    config = try CoreConfig.parse(arguments: arguments, environment: ProcessInfo.processInfo.environment)
} catch {
    FileHandle.standardError.write(Data("wisp-core: \(error.message)\n\(CoreConfig.usage)\n".utf8))
    exit(64)
}
let log = Log(level: config.logLevel)

let backend: any ModelBackend
do {
    backend = try makeBackend(config, echoCrash: {
        FileHandle.standardError.write(Data("wisp-core: echo !crash: exiting with status 70 as a crash would\n".utf8))
        exit(70)
    })
} catch {
    // Stay up and say why on every call: the shim reports it better than a dead child would.
    log(.warning, error.message)
    backend = UnavailableBackend(name: config.backend, reason: error.message)
}

/// The single writer: whole frames, one at a time, straight to fd 1.
let stdoutLock = Mutex(())
@Sendable func writeFrame(_ bytes: [UInt8]) {
    stdoutLock.withLock { _ in
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = write(1, buffer.baseAddress! + offset, buffer.count - offset)
                if n > 0 {
                    offset += n
                } else if n < 0 && errno == EINTR {
                    continue
                } else {
                    // The shim is gone; nobody is left to answer.
                    exit(0)
                }
            }
        }
    }
}

let roots = Roots(config.roots.isEmpty ? [FileManager.default.currentDirectoryPath] : config.roots, allowHardLinks: config.allowHardLinks)
if roots.paths.count < max(1, config.roots.count) { log(.warning, "some --root directories do not exist; model tools read only: \(roots.paths)") }
var store: ThreadStore?
var storeError: String?
if let dir = config.stateDir {
    do {
        store = try ThreadStore(directory: dir, maxStored: config.maxStoredThreads, log: log)
    } catch {
        // Serving in memory beats not serving; the shim is told (Ready.durable false) and says so.
        log(.error, error.message)
        storeError = error.message
    }
}
let registry = ThreadRegistry(backend: backend, capacity: config.maxThreads, maxQueue: config.maxQueue,
                              tools: ToolCatalogue.tools(roots: roots),
                              toolsWithRoots: { extra in ToolCatalogue.tools(roots: roots.adding(extra)) },
                              fileRoots: roots, store: store, storeError: storeError)
let server = PipeServer(registry: registry, backend: backend, log: log, send: writeFrame)
server.ready()
log(.info, "ready: backend \(backend.name), model \(backend.model), max threads \(config.maxThreads)"
    + (store.map { ", threads stored in \($0.directory) (at most \($0.maxStored))" } ?? ""))

let (incoming, continuation) = AsyncStream<RequestReader.Item>.makeStream(bufferingPolicy: .unbounded)

/// How long calls get to end once stdin has closed.
let shutdownGrace = Duration.seconds(2)
// Blocking reads belong on their own thread, not the cooperative pool (2 cores: 2 pool threads).
Thread.detachNewThread {
    var reader = RequestReader()
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    func protocolError(_ error: any Error) -> Never {
        FileHandle.standardError.write(Data("wisp-core: protocol error: \(error); exiting so the shim restarts a clean core\n".utf8))
        exit(65)
    }
    while true {
        let n = buffer.withUnsafeMutableBytes { read(0, $0.baseAddress!, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 {
            do { try reader.finish() } catch { protocolError(error) }
            continuation.finish()
            // Exits from here, not from the dispatcher: a call that ignores cancellation may be
            // holding every pool thread, and the core must go when the shim does all the same.
            log(.info, "stdin closed: stopping \(server.callsInFlight) call(s) in flight and exiting")
            if !server.stopAll(grace: shutdownGrace) {
                log(.warning, "\(server.callsInFlight) call(s) did not stop within \(shutdownGrace); exiting anyway")
            }
            exit(0)
        }
        do {
            for item in try reader.feed(buffer[0..<n]) { continuation.yield(item) }
        } catch {
            protocolError(error)
        }
    }
}

// The dispatcher runs on the cooperative pool, not on the main actor (top-level code's
// executor): `handle` is nonisolated, so from the main actor every request cost a hop to a
// pool thread and another back, each a thread wake-up (~20 us of a ~60 us round trip on 2 cores).
await Task.detached { [server, incoming] in
    for await item in incoming {
        switch item {
        case .request(let request): await server.handle(request)
        case .rejected(let id, let message): server.reject(id: id, message)
        }
    }
}.value

// stdin closed: the reader thread stops the calls and exits the process. Returning from here
// would exit too, before the calls' replies are written.
while true { try? await Task.sleep(for: .seconds(3600)) }
