import WispInfrastructure

/// The checks of a fleet's endpoints (`Fleet.swift`): every endpoint is checked when the core
/// starts, in the background, so that the first call finds them judged; one that is down is
/// checked again once its pause is over (started by the next turn, which does not wait for it);
/// `status` checks them all. A check is one endpoint's probes (`OpenAIServer.state`), all
/// endpoints' in parallel, each bounded whole by `bound`: an endpoint that accepts a connection
/// and never answers is down "no answer within 3 s", and nothing waits on it longer.
final class FleetChecks: Sendable {
    /// The most one endpoint's check may take, whole: a few round trips to a healthy server.
    static let bound = Duration.seconds(3)

    let servers: [OpenAIServer]
    let pins: FleetPins
    private let ends = CheckEnds()

    init(servers: [OpenAIServer]) {
        self.servers = servers
        pins = FleetPins(names: servers.map(\.hostPort))
    }

    /// Starts a check of every endpoint due one (never judged, or down past its pause); waits for none.
    func startDue() {
        let now = ContinuousClock.now
        for i in servers.indices where servers[i].health.withLock({ $0.due(at: now) }) {
            _ = begin(i)
        }
    }

    /// Every endpoint as a check finds it now (joining one under way), in order.
    func checkAll() async -> [EndpointInfo] {
        await withTaskGroup(of: (Int, EndpointInfo).self) { group in
            for i in servers.indices { group.addTask { (i, await self.check(i)) } }
            var all: [(Int, EndpointInfo)] = []
            for await one in group { all.append(one) }
            return all.sorted { $0.0 < $1.0 }.map(\.1)
        }
    }

    /// Which endpoints (not in `skipping`) a new pin may go to: those up, and those in their first
    /// check, which a turn placed there waits for (`FleetSession`): a wait on its own endpoint's
    /// probe only, so that every thread is placed by the hash over the endpoints, judged or not yet.
    func open(skipping: Set<Int>) -> [Bool] {
        servers.indices.map { i in
            !skipping.contains(i) && servers[i].health.withLock { h in
                h.usable || (h.checking != nil && !h.up && h.down == nil && h.leftOut == nil)
            }
        }
    }

    /// Returns once an endpoint not in `skipping` is up, or none of them is being checked. A turn
    /// waits here only while no endpoint is up at all (the core has just started), when it has
    /// nowhere else to go; every check ends within `bound`, so this wait does too.
    func settle(skipping: Set<Int> = []) async {
        startDue()
        while true {
            let seen = ends.count
            let states = servers.indices.filter { !skipping.contains($0) }.map { i in
                servers[i].health.withLock { ($0.usable, $0.checking != nil) }
            }
            if states.contains(where: \.0) || !states.contains(where: \.1) { return }
            await ends.wait(after: seen)
        }
    }

    /// Endpoint `i`'s check: the one under way, or a new one.
    func check(_ i: Int) async -> EndpointInfo { await begin(i).value }

    /// The check under way, or a new one, marked under way before this returns (so a turn that
    /// looks next finds it). Unstructured, so that an asker that stops waiting leaves it to end,
    /// within its bound, for the others.
    private func begin(_ i: Int) -> Task<EndpointInfo, Never> {
        let server = servers[i]
        return server.health.withLock { h -> Task<EndpointInfo, Never> in
            if let running = h.checking { return running }
            // Its end takes this lock again, so it cannot clear `checking` before it is set here.
            let started = Task { [pins, ends] in
                let info = await server.boundedState(pinned: pins.loads[i])
                server.health.withLock { $0.checking = nil }
                ends.ended()
                return info
            }
            h.checking = started
            return started
        }
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
    /// `--model` is left out, one that cannot be reached is down, one that answers is up.
    func state(pinned: Int, judge: Bool) async -> EndpointInfo {
        let said = await availability()
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
        return EndpointInfo(endpoint: hostPort, up: up,
                            reason: h.leftOut ?? (up ? nil : said.reason ?? h.down?.reason),
                            model: up ? await requestModel() : nil, context_size: up ? await contextSize() : nil,
                            slots: up ? await slotPool()?.count : nil, pinned: pinned)
    }
}
