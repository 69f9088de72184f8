#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import Dispatch
import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The core process's end, in one place: every way it ends, the status each exits with, and
/// the shutdown at stdin EOF as an escalation written as data, in the manner of
/// swift-service-lifecycle's service group (graceful first, then cancellation, then the end).
///
/// It has an OS thread of its own, neither the pipe loop (the calls it waits for may need the
/// loop to end) nor the cooperative pool (a call that ignores cancellation, such as a backend or
/// tool burning a CPU, may hold every OS thread of the pool, and the shutdown must still end).
public final class Lifecycle: Sendable {
    /// How the core winds down once stdin has ended. Each step runs, then waits at most its time
    /// for the calls in flight to end; once none is left the steps still to come are skipped.
    /// After the last step the core exits, calls in flight or not.
    public struct Escalation: Sendable {
        public enum Step: Sendable, Equatable {
            /// No call is taken any more (one read from now on starts stopped); those in flight may finish.
            case drain(Duration)
            /// Every call in flight is stopped as cancelled.
            case cancel(Duration)

            var time: Duration {
                switch self {
                case .drain(let d), .cancel(let d): d
                }
            }
        }

        public var steps: [Step]
        /// How long the last log lines get to reach stderr before the exit: bounded, since a
        /// stderr nobody reads must not keep a dying core alive.
        public var lastWords: Duration
        /// The backstop, beyond the steps' own time: only the pipe loop reads stdin, so a call
        /// stuck on it (a bug: everything known to block runs off it) would keep the end from
        /// being seen. This long after stdin's hang-up, counted without reading it, the core
        /// exits whatever the pipe loop is doing.
        public var backstopMargin: Duration

        public init(steps: [Step], lastWords: Duration, backstopMargin: Duration) {
            self.steps = steps
            self.lastWords = lastWords
            self.backstopMargin = backstopMargin
        }

        /// The core's. No drain: the shim closes stdin once it has answered its callers itself
        /// (or has given up on this core), so no reply is awaited and calls are stopped at once.
        public static let core = Escalation(steps: [.drain(.zero), .cancel(.seconds(2))],
                                            lastWords: .milliseconds(500), backstopMargin: .seconds(1))

        /// How long after stdin's hang-up the core exits at the latest (before its last words).
        public var backstop: Duration { steps.reduce(.zero) { $0 + $1.time } + backstopMargin }
    }

    /// Why the core ends.
    public enum Ending: Sendable, Equatable {
        /// stdin ended and the escalation ran (or every call ended before its end).
        case inputEnded
        /// stdin hung up and the pipe loop did not see it within the backstop.
        case backstop
        /// A write to stdout failed: the shim is gone, and nobody is left to answer.
        case outputClosed
        /// A frame the core cannot decode: the shim then restarts a clean core.
        case protocolError
        /// The echo backend's `!crash`, as a crash would.
        case crash

        public var status: Int32 {
            switch self {
            case .inputEnded, .backstop, .outputClosed: 0
            case .protocolError: 65
            case .crash: 70
            }
        }

        /// Whether the last log lines get their time: not when stdout broke, which ends the
        /// core at once (its stderr most likely went with the shim).
        var waitsForLastWords: Bool { self != .outputClosed }
        /// Whether `atExit`'s work runs: on every end but the one that plays a crash.
        var cleansUp: Bool { self != .crash }
    }

    private struct State {
        /// The pipe loop has read stdin's end.
        var inputEnded = false
        /// An ending has begun: any later one waits for the exit.
        var ending = false
    }

    private let log: Log
    private let escalation: Escalation
    private let exitProcess: @Sendable (Int32) -> Never
    private let state = Locked(State())
    /// Wakes the lifecycle's OS thread: the input ended, or the last call did.
    private let wakeUp = WakeUpPipe(for: "the lifecycle")
    /// What runs before the exit (the store's checkpoint), in order.
    private let cleanUp = Locked<[@Sendable () -> Void]>([])
    /// How long `atExit`'s work gets before the process exits anyway.
    public static let cleanUpTime = Duration.seconds(3)

    /// The C library's `exit`, named apart from the initializer's parameter that shadows it.
    public static func exitProcess(_ status: Int32) -> Never { exit(status) }

    /// `exit`: how the process exits (tests record the status instead).
    public init(log: Log, escalation: Escalation = .core,
                exit: @escaping @Sendable (Int32) -> Never = { Lifecycle.exitProcess($0) }) {
        self.log = log
        self.escalation = escalation
        self.exitProcess = exit
    }

    /// Starts the lifecycle's OS thread: it watches `input` for its hang-up (without reading it)
    /// and, once the pipe loop reports the end (`inputEnded`), runs the escalation on `server`.
    public func start(server: PipeServer, input: Int32) {
        OSThread.detach { [self] in run(server, input) }
    }

    /// `work` runs once, before the process exits (on every end but a played crash), for at most
    /// `cleanUpTime` with the rest of that work.
    public func atExit(_ work: @escaping @Sendable () -> Void) { cleanUp.withLock { $0.append(work) } }

    /// `signals` (SIGTERM and SIGINT: the shim's last resort, or a terminal's ^C reaching the
    /// whole group) end the core as stdin's end does: calls stopped, the store closed, then the
    /// exit. Keep the sources it returns: a source let go stops watching. The handler is set up
    /// here, not in main.swift, where a closure would inherit the main actor's isolation and
    /// trap when Dispatch runs it on its own queue.
    public func endOn(signals: [Int32]) -> [any DispatchSourceSignal] {
        signals.map { sig in
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { [self] in
                log(.info, "signal \(sig): stopping as at stdin's end")
                inputEnded()
            }
            source.resume()
            return source
        }
    }

    /// The pipe loop has read the end of stdin (after its last whole frame).
    public func inputEnded() {
        state.withLock { $0.inputEnded = true }
        wakeUp.wake()
    }

    /// Ends the process now, from any OS thread: logs `why` at `level`, gives the last words their
    /// time where the ending allows, and exits with the ending's status. The first ending wins;
    /// an OS thread that asks for another waits for that exit.
    public func end(_ ending: Ending, _ level: LogLevel = .error, _ why: String? = nil) -> Never {
        let first = state.withLock { s -> Bool in
            defer { s.ending = true }
            return !s.ending
        }
        guard first else {
            while true { sleep(60) }
        }
        if let why { log(level, why) }
        if ending.cleansUp { runCleanUp() }
        if ending.waitsForLastWords { Log.flush(within: escalation.lastWords) }
        exitProcess(ending.status)
    }

    /// On an OS thread of its own, so that work stuck on a lock cannot keep the process alive.
    private func runCleanUp() {
        let work = cleanUp.withLock { w in defer { w = [] }; return w }
        guard !work.isEmpty else { return }
        let done = DispatchSemaphore(value: 0)
        OSThread.detach {
            for w in work { w() }
            done.signal()
        }
        let (seconds, attoseconds) = Self.cleanUpTime.components
        if done.wait(timeout: .now() + Double(seconds) + Double(attoseconds) / 1e18) == .timedOut {
            log(.warning, "the work before exit did not end within \(Self.shown(Self.cleanUpTime)); exiting anyway")
        }
    }

    private func run(_ server: PipeServer, _ input: Int32) -> Never {
        let clock = ContinuousClock()
        var hungUp: ContinuousClock.Instant?
        /// Once the shutdown began: the steps still to run, and when the running one's time is up.
        var shutdown: (rest: ArraySlice<Escalation.Step>, until: ContinuousClock.Instant)?
        while true {
            let deadlines = [hungUp.map { $0 + escalation.backstop }, shutdown?.until].compactMap { $0 }
            let timeout = deadlines.min().map { Self.milliseconds(until: $0, clock) } ?? -1
            // Events 0 on the input: only its hang-up (or an error) wakes the poll, never its bytes.
            var fds = [pollfd(fd: hungUp == nil ? input : -1, events: 0, revents: 0),
                       pollfd(fd: wakeUp.readEnd, events: Int16(POLLIN), revents: 0)]
            _ = poll(&fds, 2, timeout)
            if fds[1].revents != 0 { wakeUp.drain() }
            if hungUp == nil, fds[0].revents & Int16(POLLHUP | POLLERR | POLLNVAL) != 0 { hungUp = clock.now }

            if let hungUp, clock.now >= hungUp + escalation.backstop {
                end(.backstop, .warning,
                    "stdin closed \(Self.shown(escalation.backstop)) ago and the pipe loop has not exited; exiting")
            }
            if shutdown == nil, state.withLock({ $0.inputEnded }) {
                log(.info, "stdin closed: stopping \(server.callsInFlight) call(s) in flight and exiting")
                shutdown = (escalation.steps[...], clock.now)
            }
            if let (rest, until) = shutdown { shutdown = escalate(server, rest, until, clock) }
        }
    }

    /// Runs each step whose predecessor's time is up, until one has time left, and returns what
    /// is left to run then; ends the process once no call is in flight, or after the last step.
    private func escalate(_ server: PipeServer, _ steps: ArraySlice<Escalation.Step>, _ until: ContinuousClock.Instant,
                          _ clock: ContinuousClock) -> (ArraySlice<Escalation.Step>, ContinuousClock.Instant) {
        var rest = steps, until = until
        while server.callsInFlight > 0, clock.now >= until {
            guard let step = rest.popFirst() else {
                let total = escalation.steps.reduce(.zero) { $0 + $1.time }
                end(.inputEnded, .warning,
                    "\(server.callsInFlight) call(s) did not stop within \(Self.shown(total)); exiting anyway")
            }
            switch step {
            case .drain: server.drain()
            case .cancel: server.cancelAll()
            }
            until = clock.now + step.time
        }
        if server.callsInFlight == 0 { end(.inputEnded) }
        // Woken when the last call ends (again after each wake-up: a call read late may have come since).
        server.whenIdle { [wakeUp] in wakeUp.wake() }
        return (rest, until)
    }

    /// Milliseconds from now until `instant`, for `poll` (0 once it has passed).
    private static func milliseconds(until instant: ContinuousClock.Instant, _ clock: ContinuousClock) -> Int32 {
        let left = clock.now.duration(to: instant)
        guard left > .zero else { return 0 }
        let (seconds, attoseconds) = left.components
        return Int32(clamping: seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
    }

    /// A duration as a log line says it: `2 s`, `0.3 s`.
    private static func shown(_ d: Duration) -> String {
        let (seconds, attoseconds) = d.components
        return attoseconds == 0 ? "\(seconds) s" : "\(Double(seconds) + Double(attoseconds) / 1e18) s"
    }
}
