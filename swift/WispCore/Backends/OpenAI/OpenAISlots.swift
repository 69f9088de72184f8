import WispInfrastructure

/// llama-server's parallel slots, one per live thread while there are enough.
///
/// A slot keeps the KV cache of the last prompt it evaluated, and llama-server evaluates only
/// the part of a new prompt that its slot does not already hold (`cache_prompt`, and with
/// `--cache-reuse` the turns that remain after condensing, shifted). Left to itself it picks a
/// slot by how much of the prompt a slot holds (more than `--slot-prompt-similarity`, 10%),
/// else the least recently used one: a thread whose history was just condensed shares only its
/// first few tokens with its own slot, lands on another, and evaluates its whole context again.
/// So each request names its thread's slot (`id_slot`): a thread keeps its slot while it lives;
/// a new thread takes a slot no live thread holds (the one it held before, if it comes back under
/// the same id), else the slot of the thread used least recently, which gives it up.
final class SlotPool: Sendable {
    private struct Slot {
        /// The live thread holding this slot; nil when its thread closed, was evicted, or never was.
        weak var owner: SessionAffinity?
        /// The thread id of the slot's last owner, whose prompt the slot may still hold.
        var lastKey: String?
        /// When a request on it last ended (the pool's clock), 0 for never.
        var lastUsed: UInt64 = 0
        var busy = false
    }

    private struct State {
        var slots: [Slot]
        var clock: UInt64 = 0
    }

    let count: Int
    private let state: Locked<State>

    init(count: Int) {
        self.count = max(1, count)
        state = Locked(State(slots: Array(repeating: Slot(), count: max(1, count))))
    }

    /// The slot for `affinity`'s next request, busy until `release`; nil when every slot is busy
    /// with another thread's request (the request then goes to whichever slot llama-server frees first).
    func acquire(_ affinity: SessionAffinity) -> Int? {
        state.withLock { s in
            if let own = s.slots.firstIndex(where: { $0.owner === affinity }) {
                guard !s.slots[own].busy else { return nil }
                s.slots[own].busy = true
                return own
            }
            let idle = s.slots.indices.filter { !s.slots[$0].busy }
            let free = idle.filter { s.slots[$0].owner == nil }
            let pick = free.first { affinity.key != nil && s.slots[$0].lastKey == affinity.key }
                ?? free.min { s.slots[$0].lastUsed < s.slots[$1].lastUsed }
                ?? idle.min { s.slots[$0].lastUsed < s.slots[$1].lastUsed }
            guard let pick else { return nil }
            s.slots[pick].owner = affinity
            s.slots[pick].lastKey = affinity.key
            s.slots[pick].busy = true
            return pick
        }
    }

    /// Ends a request on `slot`: it counts as used now.
    func release(_ slot: Int) {
        state.withLock { s in
            guard s.slots.indices.contains(slot) else { return }
            s.clock += 1
            s.slots[slot].busy = false
            s.slots[slot].lastUsed = s.clock
        }
    }

    /// Which slot each thread holds (nil: none), by slot: for tests.
    var owners: [String?] {
        state.withLock { s in s.slots.map { $0.owner.map { $0.key ?? "" } } }
    }
}
