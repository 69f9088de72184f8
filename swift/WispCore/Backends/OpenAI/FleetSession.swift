import WispInfrastructure

/// One conversation over a fleet of endpoints (`Fleet.swift`): each turn goes to the thread's
/// pinned endpoint; one that fails before the caller saw any of the answer is marked down and the
/// turn is tried once more on the next endpoint by the hash, which re-reads the whole thread.
/// A stream cut short counts as a failure like a reset. (One endpoint has `OpenAISession` alone.)
final class FleetSession: ModelSession {
    private let fleet: FleetChecks
    private let tools: [ModelTool]
    private let affinity: SessionAffinity
    /// The thread as the last endpoint's session holds it, to go on from elsewhere.
    private var messages: [ChatMessage]
    private var current: (endpoint: Int, session: OpenAISession)?

    init(fleet: FleetChecks, instructions: String?, tools: [ModelTool], history: [Turn], affinity: SessionAffinity) {
        self.fleet = fleet
        self.tools = tools
        self.affinity = affinity
        messages = OpenAISession.messages(instructions: instructions, history: history[...])
    }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings,
                 onPartial: PartialHandler?) async throws -> Generation {
        let servers = fleet.servers
        var failed: Set<Int> = []
        while true {
            var open = fleet.open(skipping: failed)
            if !open.contains(true) {
                await fleet.settle(skipping: failed)
                open = fleet.open(skipping: failed)
            }
            guard let endpoint = fleet.pins.endpoint(for: affinity, usable: open) else { throw allDown() }
            if !servers[endpoint].health.withLock({ $0.usable }) {
                _ = await fleet.check(endpoint)  // its first check: then it is up, or the pin moves
                continue
            }
            let moved = current.map { $0.endpoint != endpoint } ?? false
            let session = current?.endpoint == endpoint ? current!.session
                : OpenAISession(server: servers[endpoint], tools: tools, messages: messages, affinity: affinity)
            let seen = Locked(false)
            do {
                var generation = try await session.respond(to: prompt, settings: settings) { partial in
                    if !partial.text.isEmpty || partial.tokens > 0 { seen.withLock { $0 = true } }
                    onPartial?(partial)
                }
                current = (endpoint, session)
                messages = session.messages
                generation.usage.endpoint = servers[endpoint].hostPort
                // The whole thread was read again there: nothing of it came from a cache.
                if moved, generation.usage.cachedTokens != nil { generation.usage.cachedTokens = 0 }
                return generation
            } catch {
                // A turn the caller saw any of is never run again; nor is one failed for another reason.
                let down = !servers[endpoint].health.withLock { $0.usable }
                if down { fleet.scheduleChecks() }  // its recheck, after its pause
                guard down, !seen.withLock({ $0 }) else { throw error }
                guard failed.isEmpty else {
                    // A turn moves once: with another endpoint still up, "every one is down" would be false.
                    let others = fleet.open(skipping: failed.union([endpoint]))
                    throw others.contains(true) ? movedAndFailed([failed.first!, endpoint]) : allDown()
                }
                current = nil
                failed.insert(endpoint)
                LogSink.shared.post("wisp-core warning: \(servers[endpoint].hostPort) is down; the turn goes to "
                                    + "the next endpoint, which reads the thread again")
            }
        }
    }

    /// The turn failed on its endpoint and again on the one it moved to, while another is up.
    private func movedAndFailed(_ tried: [Int]) -> WispError {
        let each = tried.map { i in
            let s = fleet.servers[i]
            return "\(s.hostPort): \(s.health.withLock { $0.down?.reason } ?? "it failed this turn")"
        }
        return WispError(.modelUnavailable, "the turn failed on its model server and on the one it moved to (a turn "
                         + "moves once; the thread is unchanged, and the next call goes to an endpoint that is up): "
                         + each.joined(separator: "; "))
    }

    /// Every endpoint, and why it cannot take the turn.
    private func allDown() -> WispError {
        let each = fleet.servers.map { s in
            let h = s.health.withLock { $0 }
            return "\(s.hostPort): \(h.leftOut ?? h.down?.reason ?? "it failed this turn")"
        }
        return WispError(.modelUnavailable, "no model server could take the turn (the thread is unchanged): "
                         + each.joined(separator: "; "))
    }
}
