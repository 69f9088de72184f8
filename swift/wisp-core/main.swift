// wisp-core: the child process the shim starts. Frames in on stdin, frames out on stdout,
// logs on stderr. It exits 64 on bad flags and on a --store this build cannot serve; once
// running, every end is `Lifecycle`'s (0 at stdin EOF after stopping the calls in flight, 65 on
// a frame it cannot decode, 70 on the echo `!crash`).
#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import Dispatch
import Synchronization
import WispCore
import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// A shim that went away must not kill us with SIGPIPE mid-write; EPIPE ends the process cleanly instead.
signal(SIGPIPE, SIG_IGN)

/// Before the log sink runs (usage, a bad flag): one blocking write to fd 2.
func toStderr(_ text: String) {
    var bytes = Array(text.utf8)
    _ = write(2, &bytes, bytes.count)
}

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.contains("--help") || arguments.contains("-h") {
    toStderr(CoreConfig.usage + "\n")
    exit(0)
}
if arguments == ["--version"] {
    print("wisp-core \(wispVersion)")
    exit(0)
}
if arguments == ["--facts"] {
    // Not the pipe: a one-off answer for `make facts` and the agreement test.
    print(CoreFacts.json.jsonText)
    exit(0)
}
if arguments == ["--check-replies"] {
    // A test aid (see OutputSchema.verdictLine), before any backend starts.
    while let line = readLine(strippingNewline: true) { print(OutputSchema.verdictLine(line)) }
    exit(0)
}
let config: CoreConfig
do {
    config = try CoreConfig.parse(arguments: arguments, environment: ProcessInfo.processInfo.environment)
} catch {
    toStderr("wisp-core: \(error.message)\n\(CoreConfig.usage)\n")
    exit(64)
}
let log = Log(level: config.logLevel)
let lifecycle = Lifecycle(log: log)

let backend: any ModelBackend
do {
    backend = try makeBackend(config, echoCrash: {
        lifecycle.end(.crash, .error, "echo !crash: exiting with status 70 as a crash would")
    })
} catch {
    // Stay up and say why on every call: the shim reports it better than a dead child would.
    log(.warning, error.message)
    backend = UnavailableBackend(name: config.backend.rawValue, reason: error.message)
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
                    lifecycle.end(.outputClosed)
                }
            }
        }
    }
}

let roots = Roots(config.roots.isEmpty ? [FileManager.default.currentDirectoryPath] : config.roots,
                  allowHardLinks: config.allowHardLinks)
if roots.paths.count < max(1, config.roots.count) {
    log(.warning, "some --root directories do not exist; model tools read only: \(roots.paths)")
}
let store: (any ThreadStore)?, storeError: String?
do {
    (store, storeError) = try openStore(config, log: log)
} catch {
    // A --store this build cannot serve: refused at start, as a bad flag is (openStore says why).
    toStderr("wisp-core: \(error.message)\n")
    exit(64)
}
let registry = ThreadRegistry(backend: backend, capacity: config.maxThreads, maxQueue: config.maxQueue,
                              tools: ToolCatalogue.tools(roots: roots),
                              toolsWithRoots: { extra in ToolCatalogue.tools(roots: roots, adding: extra) },
                              fileRoots: roots, store: store ?? NoThreadStore(), storeError: storeError)
let loop = PipeLoop()
let server = PipeServer(registry: registry, backend: backend, log: log, executor: loop, send: writeFrame)
server.ready(version: wispVersion)
log(.info, "ready: backend \(backend.name), model \(backend.model), max threads \(config.maxThreads)"
    + (store.map { ", threads stored in \($0.location) (at most \($0.maxStored))" } ?? ""))

let (incoming, continuation) = AsyncStream<RequestReader.Item>.makeStream(bufferingPolicy: .unbounded)

// The dispatcher takes requests in arrival order (that order is each thread's order) and runs
// on the pipe loop, as the calls it starts do (PipeLoop says why).
Task(executorPreference: loop) { [server, incoming] in
    for await item in incoming {
        switch item {
        case .request(let request): await server.handle(request.operation)
        case .rejected(let id, let message): server.reject(id: id, message)
        }
    }
}

lifecycle.start(server: server, input: 0)
// Every end but a played crash folds the store's log into its database first (Lifecycle.end),
// and ends the backend's timers (a fleet's rechecks), which would otherwise start checks as it exits.
if let store { lifecycle.atExit { store.close() } }
lifecycle.atExit { backend.stop() }
let stopSignals = lifecycle.endOn(signals: [SIGTERM, SIGINT])

func protocolError(_ error: any Error) -> Never {
    lifecycle.end(.protocolError, .error, "protocol error: \(error); exiting so the shim restarts a clean core")
}

// The main OS thread becomes the pipe loop for good: it reads stdin and runs the pipe's work.
var reader = RequestReader()
loop.run(input: 0) { bytes in
    guard !bytes.isEmpty else {
        do { try reader.finish() } catch { protocolError(error) }
        continuation.finish()
        lifecycle.inputEnded()
        return
    }
    do {
        for item in try reader.feed(bytes) { continuation.yield(item) }
    } catch {
        protocolError(error)
    }
}
