import Foundation

/// A lock around a value, as `Mutex` is, but over `NSLock` (a pthread mutex): on Linux the
/// toolchain's `Synchronization.Mutex` locks with uninstrumented atomics and futexes, so
/// ThreadSanitizer cannot see it and reports every access it guards as a race (`make sanitize`
/// did, once the pipe server's calls were raced in tests).
final class Locked<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
