import WispInfrastructure

/// The checks of a fleet's endpoints (`Fleet.swift`): every endpoint is checked when the core
/// starts, in the background, so that the first call finds them judged; one that is down is
/// checked again once its pause is over, by a timer of its own, so that neither a call nor
/// `status` starts a check or waits on one (but for an endpoint's first). A check is one
/// endpoint's probes (`OpenAIServer.state`), all endpoints' in parallel, each bounded whole by
/// `bound`: an endpoint that accepts a connection and never answers is down "no answer within
/// 3 s", and nothing waits on it longer.
final class FleetChecks: Sendable {
    /// The most one endpoint's check may take, whole: a few round trips to a healthy server.
    static let bound = Duration.seconds(3)

    let servers: [OpenAIServer]
    let pins: FleetPins
    private let ends = CheckEnds()
    /// Set at shutdown: no timer is started after it.
    private let stopped = Locked(false)

    init(servers: [OpenAIServer]) {
        self.servers = servers
        pins = FleetPins(names: servers.map(\.hostPort))
    }

    deinit { stop() }

    /// The one judgement of when each endpoint is checked next: one never judged at once, one
    /// down at the end of its pause (a timer, which a check that finds it down again, or a turn
    /// that marks it down, sets anew); waits for none.
    func scheduleChecks() {
        let now = ContinuousClock.now
        for i in servers.indices {
            servers[i].health.withLock { h in
                guard let at = h.nextCheck(at: now), !stopped.withLock({ $0 }) else { return }
                guard h.down != nil else {
                    _ = start(i, &h)  // its first: under way before this returns, for `open`
                    return
                }
                h.recheck = Task { [weak self] in
                    try? await Task.sleep(until: at)
                    guard !Task.isCancelled, let self else { return }
                    self.servers[i].health.withLock { h in
                        h.recheck = nil
                        _ = self.start(i, &h)
                    }
                }
            }
        }
    }

    /// Ends every timer; a check under way ends within its bound.
    func stop() {
        stopped.withLock { $0 = true }
        for server in servers {
            server.health.withLock { h in
                h.recheck?.cancel()
                h.recheck = nil
            }
        }
    }

    /// Every endpoint as it was last found, in order, asking none of them anything; an endpoint
    /// still in its first check is waited for (at most `bound`), so that `--check` says what it is.
    func report() async -> [EndpointInfo] {
        await withTaskGroup(of: Void.self) { group in
            for i in servers.indices where !servers[i].health.withLock({ $0.judged }) {
                group.addTask { _ = await self.check(i) }
            }
        }
        let loads = pins.loads
        return servers.indices.map { servers[$0].lastKnown(pinned: loads[$0]) }
    }

    /// Which endpoints (not in `skipping`) a new pin may go to: those up, and those in their first
    /// check, which a turn placed there waits for (`FleetSession`): a wait on its own endpoint's
    /// probe only, so that every thread is placed by the hash over the endpoints, judged or not yet.
    func open(skipping: Set<Int>) -> [Bool] {
        servers.indices.map { i in
            !skipping.contains(i) && servers[i].health.withLock { h in h.usable || (h.checking != nil && !h.judged) }
        }
    }

    /// Returns once an endpoint not in `skipping` is up, or none of them is in its first check. A
    /// turn waits here only while no endpoint is up at all (the core has just started), when it has
    /// nowhere else to go; every check ends within `bound`, so this wait does too. A recheck of an
    /// endpoint that was down is waited for by nobody.
    func settle(skipping: Set<Int> = []) async {
        scheduleChecks()
        while true {
            let seen = ends.count
            let states = servers.indices.filter { !skipping.contains($0) }.map { i in
                servers[i].health.withLock { ($0.usable, $0.checking != nil && !$0.judged) }
            }
            if states.contains(where: \.0) || !states.contains(where: \.1) { return }
            await ends.wait(after: seen)
        }
    }

    /// Endpoint `i`'s check: the one under way, or a new one.
    func check(_ i: Int) async -> EndpointInfo { await servers[i].health.withLock { start(i, &$0) }.value }

    /// The check under way, or a new one, marked under way in `h` (endpoint `i`'s health, locked
    /// by the caller) before this returns, so that a turn that looks next finds it. Unstructured,
    /// so that an asker that stops waiting leaves it to end, within its bound, for the others.
    private func start(_ i: Int, _ h: inout EndpointHealth) -> Task<EndpointInfo, Never> {
        if let running = h.checking { return running }
        let server = servers[i]
        // Its end takes the lock again, so it cannot clear `checking` before it is set here.
        let started = Task { [weak self, pins, ends] in
            let info = await server.boundedState(pinned: pins.loads[i])
            server.health.withLock { $0.checking = nil }
            ends.ended()
            self?.scheduleChecks()  // found down again: its next check, after a longer pause
            return info
        }
        h.checking = started
        return started
    }
}

/// Wakes whoever waits for a check to end (`FleetChecks.settle`). A count, so that an end between
/// looking and waiting is not missed.
final class CheckEnds: Sendable {
    private let state = Locked((ended: 0, waiters: [CheckedContinuation<Void, Never>]()))

    var count: Int { state.withLock { $0.ended } }

    /// Returns once more than `seen` checks have ended.
    func wait(after seen: Int) async {
        await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if s.ended > seen { return true }
                s.waiters.append(waiter)
                return false
            }
            if now { waiter.resume() }
        }
    }

    func ended() {
        let waiting = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.ended += 1
            defer { s.waiters = [] }
            return s.waiters
        }
        for waiter in waiting { waiter.resume() }
    }
}

extension OpenAIServer {
    /// `state`, judged and bounded whole by `FleetChecks.bound`: past it the endpoint is down.
    func boundedState(pinned: Int) async -> EndpointInfo {
        let bound = FleetChecks.bound
        let info = await withTaskGroup(of: EndpointInfo?.self) { group in
            group.addTask { await self.state(pinned: pinned, judge: true) }
            group.addTask {
                try? await Task.sleep(for: bound)
                return nil
            }
            defer { group.cancelAll() }  // the probes' requests are closed
            return await group.next() ?? nil
        }
        if let info { return info }
        let reason = "no answer within \(bound.components.seconds) s"
        health.withLock { $0.failed(reason, at: .now) }
        LogSink.shared.post("wisp-core warning: \(hostPort) is down: \(reason)")
        return EndpointInfo(endpoint: hostPort, up: false, reason: reason, pinned: pinned)
    }

    /// This endpoint as `--check` shows it. `judge` (in a fleet): one that does not list
    /// `--model` is left out, one that cannot be reached is down, one that answers is up; asked
    /// afresh (not from the last answer's time), since a check is what finds one down.
    func state(pinned: Int, judge: Bool) async -> EndpointInfo {
        let said = await availability(fresh: judge)
        // Past the bound: `boundedState` judges it, once.
        guard !Task.isCancelled else { return EndpointInfo(endpoint: hostPort, up: false, pinned: pinned) }
        let served = facts.withLock { $0.served }
        let h = health.withLock { h in
            if judge, let model = configuredModel, let served, !served.contains(model) {
                h.leftOut = "it does not serve --model '\(model.preview)' (it serves "
                    + served.prefix(8).map { "'\($0.preview)'" }.joined(separator: ", ") + ")"
            }
            if judge { said.available ? h.answered() : h.failed(said.reason ?? "not available", at: .now) }
            return h
        }
        let up = said.available && h.leftOut == nil
        var window: Int?
        if up {  // learnt now (the model and slots kept in `facts`)
            _ = await requestModel()
            window = await contextSize()
            _ = await slotPool()
        }
        return shown(up: up, reason: h.leftOut ?? (up ? nil : said.reason ?? h.down?.reason), window: window,
                     pinned: pinned)
    }

    /// As the last check or answer left it (a fleet's `status`), asking the server nothing.
    func lastKnown(pinned: Int) -> EndpointInfo {
        let h = health.withLock { ($0.usable, $0.leftOut ?? $0.down?.reason) }
        let window = facts.withLock { knownContextSize(in: $0) } ?? configuredContextSize ?? Self.fallbackContextSize
        return shown(up: h.0, reason: h.0 ? nil : h.1, window: window, pinned: pinned)
    }

    /// What is known of it, for `--check`: its model, window and slots while it is up.
    private func shown(up: Bool, reason: String?, window: Int?, pinned: Int) -> EndpointInfo {
        EndpointInfo(endpoint: hostPort, up: up, reason: reason, model: up ? modelName : nil,
                     context_size: up ? window : nil, slots: up ? facts.withLock { $0.slots?.count } : nil,
                     pinned: pinned)
    }
}
