// What full Foundation gave the core and FoundationEssentials does not (threads, a pthread
// mutex, whitespace trimming): on Linux the core links FoundationEssentials only, so a static
// build carries no ICU or full Foundation (issue 46). The same code runs on macOS, so the two
// platforms behave alike.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A pthread mutex. The mutex lives at a fixed heap address for the lock's life (a pthread mutex
/// must not move); the address is held as its bit pattern, an `Int`, so that the compiler can
/// check the class Sendable without an unchecked conformance.
public final class PlainLock: Sendable {
    private let address: Int

    public init() {
        let m = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        m.initialize(to: pthread_mutex_t())
        pthread_mutex_init(m, nil)
        address = Int(bitPattern: m)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    private var mutex: UnsafeMutablePointer<pthread_mutex_t> {
        UnsafeMutablePointer<pthread_mutex_t>(bitPattern: address).unsafelyUnwrapped
    }

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }
}

/// Threads of the operating system's own, for the blocking work the pipe, the HTTP client and
/// the log sink keep off Swift's cooperative pool.
public enum OSThread {
    private final class Body {
        let run: () -> Void
        init(_ run: @escaping () -> Void) { self.run = run }
    }

    /// Starts `body` on a new detached thread. A process that cannot start a thread cannot
    /// serve: it stops with the reason rather than dropping the work unseen.
    public static func detach(_ body: @escaping @Sendable () -> Void) {
        let context = Unmanaged.passRetained(Body(body)).toOpaque()
        // Darwin's pthread_t is a pointer (its pthread_create fills a `pthread_t?` and passes the
        // context non-optional); Glibc's is an integer.
        #if canImport(Darwin)
        var thread: pthread_t?
        #else
        var thread = pthread_t()
        #endif
        let started = pthread_create(&thread, nil, { context in
            #if canImport(Darwin)
            let body = Unmanaged<Body>.fromOpaque(context).takeRetainedValue()
            #else
            let body = Unmanaged<Body>.fromOpaque(context!).takeRetainedValue()
            #endif
            body.run()
            return nil
        }, context)
        guard started == 0 else { fatalError("wisp-core: cannot start a thread (error \(started))") }
        #if canImport(Darwin)
        if let thread { pthread_detach(thread) }
        #else
        pthread_detach(thread)
        #endif
    }

    /// Blocks this thread for `seconds` (not a task: the callers are threads of their own).
    public static func sleep(seconds: Double) {
        let whole = Int(seconds)
        var time = timespec(tv_sec: whole, tv_nsec: Int((seconds - Double(whole)) * 1_000_000_000))
        var left = timespec()
        while nanosleep(&time, &left) != 0 && errno == EINTR { time = left }
    }
}

extension StringProtocol {
    /// Without the spaces and tabs at either end (what `.whitespaces` trimmed; HTTP's OWS and
    /// the model servers' padding are only these).
    public func trimmingSpaces() -> String { trimmed { $0 == " " || $0 == "\t" || $0.properties.isWhitespace && !isNewline($0) } }

    /// Without the white space and line ends at either end (Unicode's White_Space, as
    /// `.whitespacesAndNewlines` did).
    public func trimmingWhitespace() -> String { trimmed { $0.properties.isWhitespace } }

    private func isNewline(_ s: Unicode.Scalar) -> Bool {
        switch s.value { case 0x0A...0x0D, 0x85, 0x2028, 0x2029: true; default: false }
    }

    private func trimmed(_ drop: (Unicode.Scalar) -> Bool) -> String {
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !drop($0) }) else { return "" }
        let last = scalars.lastIndex(where: { !drop($0) })!
        return String(String.UnicodeScalarView(scalars[first...last]))
    }
}
