import WispInfrastructure

/// Echo's meeting points, so that a test proves order and overlap by rendezvous rather than by
/// the clock (docs/echo.md): `!hold KEY` parks a call until `!release KEY`, and `!held KEY N`
/// answers once N calls hold KEY. One per backend, so every thread of a core shares them.
final class EchoHolds: Sendable {
    /// A parked call: a hold (`atLeast` nil) or a watcher waiting for `atLeast` holds of `key`.
    private struct Waiter {
        let key: String
        let atLeast: Int?
        let wake: CheckedContinuation<Void, Never>
    }

    private struct State {
        var next: UInt64 = 0
        var waiters: [UInt64: Waiter] = [:]
        /// Waits cancelled before they parked: they must not park at all.
        var cancelled: Set<UInt64> = []
    }

    private let state = Locked(State())

    /// Until `release(key)`; throws `callCancelled` when the call is cancelled first.
    func hold(_ key: String) async throws(WispError) { try await park(key, atLeast: nil) }

    /// Until at least `count` calls hold `key` at once.
    func held(_ key: String, count: Int) async throws(WispError) { try await park(key, atLeast: count) }

    /// Frees every call holding `key` now; how many it freed (a later hold waits for a later release).
    func release(_ key: String) -> Int {
        let woken = state.withLock { s in
            let ids = s.waiters.filter { $0.value.key == key && $0.value.atLeast == nil }.map(\.key)
            return ids.compactMap { s.waiters.removeValue(forKey: $0)?.wake }
        }
        woken.forEach { $0.resume() }
        return woken.count
    }

    private func park(_ key: String, atLeast: Int?) async throws(WispError) {
        let id = state.withLock { s in
            s.next &+= 1
            return s.next
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (wake: CheckedContinuation<Void, Never>) in
                let woken = state.withLock { s in
                    if s.cancelled.remove(id) != nil { return [wake] }
                    s.waiters[id] = Waiter(key: key, atLeast: atLeast, wake: wake)
                    return Self.satisfied(&s, key)
                }
                woken.forEach { $0.resume() }
            }
        } onCancel: {
            let woken = state.withLock { s in
                guard let parked = s.waiters.removeValue(forKey: id) else {
                    s.cancelled.insert(id)
                    return nil as CheckedContinuation<Void, Never>?
                }
                return parked.wake
            }
            woken?.resume()
        }
        // A cancel that came after the wake left its mark; the handler no longer runs past here.
        state.withLock { s in _ = s.cancelled.remove(id) }
        if Task.isCancelled { throw WispError.callCancelled }
    }

    /// The watchers of `key` whose count is reached, taken out of the line.
    private static func satisfied(_ s: inout State, _ key: String) -> [CheckedContinuation<Void, Never>] {
        let holding = s.waiters.values.filter { $0.key == key && $0.atLeast == nil }.count
        let ready = s.waiters.filter { $0.value.key == key && ($0.value.atLeast ?? Int.max) <= holding }.map(\.key)
        return ready.compactMap { s.waiters.removeValue(forKey: $0)?.wake }
    }
}
