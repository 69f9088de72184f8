#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// A lock around a value. The value lives in a `Mutex`, so the compiler checks that this is
/// Sendable; every access also takes a `PlainLock` (a pthread mutex) first, because on Linux the
/// toolchain's `Synchronization.Mutex` locks with uninstrumented atomics and futexes, which
/// ThreadSanitizer cannot see: guarded by the Mutex alone, every access was reported as a race
/// (`make sanitize` did, once the pipe server's calls were raced in tests). The Mutex is never
/// contended, since the PlainLock is always held around it.
public final class Locked<Value: Sendable>: Sendable {
    private let order = PlainLock()
    private let value: Mutex<Value>

    public init(_ value: Value) { self.value = Mutex(value) }

    public func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        order.lock()
        defer { order.unlock() }
        return try value.withLock { v in try body(&v) }
    }
}

/// A lock around a value that is not Sendable (a database connection): the value never leaves
/// the lock, only what a body returns does. Locked as `Locked` is, for the same reason.
public final class Exclusive<Value>: Sendable {
    private let order = PlainLock()
    private let value: Mutex<Value>

    public init(_ value: consuming sending Value) { self.value = Mutex(value) }

    public func withLock<R: Sendable, E: Error>(_ body: (inout sending Value) throws(E) -> R) throws(E) -> R {
        order.lock()
        defer { order.unlock() }
        return try value.withLock { (v: inout sending Value) throws(E) -> R in try body(&v) }
    }
}
