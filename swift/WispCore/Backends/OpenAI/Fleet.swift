import WispInfrastructure

/// Several model servers behind one backend (`--endpoint` given more than once): which one a
/// thread's turns go to, and which are down. A server that holds a thread's context reads only
/// the new turn; another re-reads all of it, so a thread stays on one endpoint while it is healthy.
///
/// The choice is rendezvous (highest random weight) hashing of the thread id over the healthy
/// endpoints, with bounded load: no endpoint takes a thread while it holds
/// ceil(1.25 × live threads ÷ healthy endpoints) pins. A pin lives as long as its thread's
/// `SessionAffinity` (held weakly), so a thread evicted or closed frees it.
enum Rendezvous {
    /// A weight stable across processes and machines (FNV-1a 64 then splitmix64's finaliser),
    /// which Swift's per-process seeded `Hasher` is not.
    static func weight(key: String, endpoint: String) -> UInt64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in key.utf8 { h = (h ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 }
        h = (h ^ 0xff) &* 0x0000_0100_0000_01b3  // a separator no UTF-8 text holds
        for byte in endpoint.utf8 { h = (h ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 }
        h ^= h >> 30; h = h &* 0xbf58_476d_1ce4_e5b9
        h ^= h >> 27; h = h &* 0x94d0_49bb_1331_11eb
        return h ^ (h >> 31)
    }

    /// `candidates` (indices into `names`) best first for `key`; ties by index.
    static func order(key: String, candidates: [Int], names: [String]) -> [Int] {
        candidates.map { ($0, weight(key: key, endpoint: names[$0])) }
            .sorted { $0.1 != $1.1 ? $0.1 > $1.1 : $0.0 < $1.0 }
            .map(\.0)
    }

    /// The most pins one endpoint may hold: ceil(1.25 × live ÷ healthy), at least 1.
    static func bound(live: Int, healthy: Int) -> Int {
        guard healthy > 0 else { return 0 }
        let (n, d) = (5 &* max(0, min(live, 1 << 40)), 4 * healthy)
        return max(1, (n + d - 1) / d)
    }

    /// Where a thread not yet pinned goes: `prefer` (a fork's source) when the bound allows,
    /// else the first in `key`'s order below the bound. `loads` counts pins per endpoint
    /// without this thread; `live` counts every pinned thread with it.
    static func place(key: String, candidates: [Int], names: [String], loads: [Int], live: Int,
                      prefer: Int? = nil) -> Int? {
        let limit = bound(live: live, healthy: candidates.count)
        if let prefer, candidates.contains(prefer), loads[prefer] < limit { return prefer }
        let ordered = order(key: key, candidates: candidates, names: names)
        return ordered.first { loads[$0] < limit } ?? ordered.first
    }
}

/// Whether an endpoint may take requests: up once a check (`FleetChecks`) or an answer showed it
/// answering; down after it refused, reset or timed out a connection, answered 5xx, cut a stream
/// or did not answer a check, and checked again after 5 s, then 10, 20, up to 60 s while it keeps
/// failing, by a timer of its own (`recheck`). Only an endpoint shown up takes a new pin or the
/// backend's questions, so nothing waits on one that was never judged, or on one down, in its
/// pause or between.
struct EndpointHealth: Sendable {
    static let firstPause = Duration.seconds(5)
    static let longestPause = Duration.seconds(60)
    /// Why it is down, and until when it is not checked again; nil while it is up or never judged.
    var down: (reason: String, until: ContinuousClock.Instant, pause: Duration)?
    /// Why it is left out for good (it does not serve `--model`); nil while it is in.
    var leftOut: String?
    /// A check or an answer showed it answering since it was last down.
    var up = false
    /// The check under way, which every asker joins.
    var checking: Task<EndpointInfo, Never>?
    /// The timer that starts its next check once its pause is over, while it is down.
    var recheck: Task<Void, Never>?

    var usable: Bool { leftOut == nil && up }
    /// A check or an answer has said something of it.
    var judged: Bool { up || down != nil || leftOut != nil }

    /// When it is to be checked next: now when never judged, at its pause's end when down; nil
    /// while it is up or left out, or a check or its timer is already under way.
    func nextCheck(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        guard leftOut == nil, !up, checking == nil, recheck == nil else { return nil }
        return down?.until ?? now
    }

    mutating func failed(_ reason: String, at now: ContinuousClock.Instant) {
        // The pause is at most a minute, so doubling it cannot overflow a Duration.
        let pause = down.map { min($0.pause * 2, Self.longestPause) } ?? Self.firstPause
        down = (reason, now + pause, pause)
        up = false
    }

    mutating func answered() {
        down = nil
        up = true
        recheck?.cancel()  // an answer said it is up: no check is due
        recheck = nil
    }
}

/// Which endpoint each live thread is pinned to.
final class FleetPins: Sendable {
    private struct Pin {
        weak var owner: SessionAffinity?
        var endpoint: Int
    }

    private let names: [String]
    private let pins = Locked([Pin]())

    init(names: [String]) { self.names = names }

    /// The endpoint for `affinity`'s next turn among `usable` (by index): its pin while that
    /// endpoint is usable, else a new pin by the rule; a fork's first pin is its source's
    /// endpoint when the bound allows.
    func endpoint(for affinity: SessionAffinity, usable: [Bool]) -> Int? {
        pins.withLock { all in
            all.removeAll { $0.owner == nil }
            let mine = all.firstIndex { $0.owner === affinity }
            if let mine, usable[all[mine].endpoint] { return all[mine].endpoint }
            if let mine { all.remove(at: mine) }
            let prefer = mine != nil ? nil : affinity.takeSource().flatMap { source in
                all.first { $0.owner === source }?.endpoint
            }
            var loads = Array(repeating: 0, count: names.count)
            for p in all { loads[p.endpoint] += 1 }
            let candidates = names.indices.filter { usable[$0] }
            guard let pick = Rendezvous.place(key: affinity.key ?? "", candidates: candidates, names: names,
                                              loads: loads, live: all.count + 1, prefer: prefer) else { return nil }
            all.append(Pin(owner: affinity, endpoint: pick))
            return pick
        }
    }

    /// Pinned threads per endpoint, by index.
    var loads: [Int] {
        pins.withLock { all in
            all.removeAll { $0.owner == nil }
            var loads = Array(repeating: 0, count: names.count)
            for p in all { loads[p.endpoint] += 1 }
            return loads
        }
    }
}
