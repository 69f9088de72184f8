// The pipe server: dispatch that a slow request does not hold up, eviction notices, transactional
// commit (a cancelled or timed-out call never keeps its turn), and shutdown with a call that
// ignores cancellation.
import Dispatch
import Foundation
import Testing
import WispInfrastructure
@testable import WispCore

@Suite struct Dispatcher {
    @Test func aSlowStatusDoesNotHoldUpOtherRequests() async throws {
        let gate = Gate()
        let (server, wire) = pipeServer(SlowToAnswerBackend(gate: gate))
        // Had the dispatcher waited for the status, it would be held here until this opens the gate.
        let backstop = Task {
            try await Task.sleep(for: .seconds(60))
            gate.open()
        }
        await server.handle(Status(id: 1))
        await server.handle(CloseThread(id: 2, thread_id: "t"))
        #expect(await wire.reply(2).body["closed"] as? Bool == false)
        gate.open()
        backstop.cancel()
        #expect(await wire.reply(1).body["backend"] as? String == "slow")
        let (status, close) = (try #require(await wire.replyIndex(1)), try #require(await wire.replyIndex(2)))
        #expect(close < status, "the dispatcher waited for status")
    }
}

@Suite struct Eviction {
    @Test func theNoticeComesBeforeTheReplyOfTheCallThatCausedIt() async throws {
        let (server, wire) = pipeServer(EchoBackend(), capacity: 2)
        for (id, thread) in [(1, "a"), (2, "b"), (3, "c")] {
            await server.handle(Respond(id: id, prompt: "hi", thread_id: thread))
            _ = await wire.reply(id)
        }
        let frames = wire.all.map(Wire.object)
        let notices = frames.enumerated().filter { $0.element["event"] as? String == "evicted" }
        #expect(notices.map { $0.element["thread_id"] as? String } == ["a"])
        #expect(notices.first.map { $0.element["id"] as? Int } == 0)
        let reply3 = try #require(await wire.replyIndex(3))
        #expect(notices.first.map { $0.offset < reply3 } == true)
        #expect(await !server.registry.contains("a"))
    }
}

// Serialized: each race needs its cancels to land on both sides of a call's end, likelier with the pool to itself.
@Suite(.serialized) struct TransactionalCalls {
    /// A creating call cancelled while the next call on its id arrives: the next call must
    /// behave as if the cancelled one never happened.
    @Test func aCancelledCreatingCallLeavesNothingForTheNextCallOnItsID() async throws {
        let (server, wire) = pipeServer(EchoBackend())
        var cancelledCount = 0
        for k in 0..<120 {
            let (a, c, b) = (3 * k + 1, 3 * k + 2, 3 * k + 3)
            let thread = "x\(k)"
            await server.handle(Respond(id: a, prompt: "!sleep \(k % 3) a", thread_id: thread, instructions: "A's"))
            if k % 4 == 1 { try await Task.sleep(for: .microseconds(Int.random(in: 0...3000))) }
            await server.handle(Cancel(id: c, request: a))
            await server.handle(Respond(id: b, prompt: "hi", thread_id: thread))
            let cancel = await wire.reply(c)
            let first = await wire.reply(a)
            let next = await wire.reply(b)
            #expect(next.ok)
            if cancel.body["cancelled"] as? Bool == true {
                cancelledCount += 1
                #expect(!first.ok && first.body["code"] as? String == "cancelled", "trial \(k): \(first.body)")
                #expect(next.body["created"] as? Bool == true, "trial \(k): \(next.body)")
                #expect(next.body["text"] as? String == "echo 1: hi", "trial \(k): \(next.body)")
            } else {
                #expect(first.ok, "trial \(k): a cancel answered false must leave the call's reply alone")
                #expect(next.body["created"] as? Bool == false && next.body["text"] as? String == "echo 2: hi", "trial \(k): \(next.body)")
            }
        }
        #expect(cancelledCount > 60, "the cancels mostly came too late to test anything")
    }

    /// Whenever a cancel lands, including right as the model finishes, the call either keeps its
    /// turn and the cancel says `false`, or is cancelled and keeps nothing: with the echo
    /// backend's cancellable `!sleep`, and with a model that finishes its answer whatever it is told.
    @Test(arguments: [false, true])
    func aCancelledCallOnAnExistingThreadNeverKeepsItsTurn(deaf: Bool) async throws {
        let (server, wire) = pipeServer(deaf ? GateBackend(gate: Gate()) : EchoBackend())
        await server.handle(Respond(id: 1, prompt: "first", thread_id: "t"))
        #expect(await wire.reply(1).body["text"] as? String == "echo 1: first")
        var turns = 1
        var outcomes = (kept: 0, cancelled: 0)
        for k in 0..<150 {
            let (r, c) = (2 * k + 2, 2 * k + 3)
            let ms = k % 4
            let prompt = "\(deaf ? "nap" : "!sleep") \(ms) k\(k)"
            await server.handle(Respond(id: r, prompt: prompt, thread_id: "t"))
            try await Task.sleep(for: .microseconds(Int.random(in: 0...(ms * 1000 + 1500))))
            await server.handle(Cancel(id: c, request: r))
            let cancel = await wire.reply(c)
            let call = await wire.reply(r)
            if call.ok {
                turns += 1
                outcomes.kept += 1
                #expect(cancel.body["cancelled"] as? Bool == false, "trial \(k): answered and kept, but the cancel said it stopped the call")
                #expect(call.body["text"] as? String == "echo \(turns): \(prompt)", "trial \(k): \(call.body)")
            } else {
                outcomes.cancelled += 1
                #expect(cancel.body["cancelled"] as? Bool == true && call.body["code"] as? String == "cancelled", "trial \(k): \(call.body)")
            }
        }
        await server.handle(Respond(id: 10_000, prompt: "probe", thread_id: "t"))
        #expect(await wire.reply(10_000).body["text"] as? String == "echo \(turns + 1): probe")
        #expect(outcomes.kept > 0 && outcomes.cancelled > 0, "\(outcomes): the cancels did not land on both sides of the end")
    }

    /// The model answers after the call's time limit (a backend that ignores cancellation, or a
    /// core stopped past the deadline): the turn is not kept.
    @Test func aCallPastItsTimeLimitNeverKeepsItsTurn() async throws {
        let gate = Gate()
        let (server, wire) = pipeServer(GateBackend(gate: gate))
        await server.handle(Respond(id: 1, prompt: "first", thread_id: "t"))
        #expect(await wire.reply(1).body["text"] as? String == "echo 1: first")
        await server.handle(Respond(id: 2, prompt: "gate", thread_id: "t", options: RespondOptions(timeout_s: 0.1)))
        await gate.waitUntilEntered()
        try await Task.sleep(for: .milliseconds(400))
        gate.open()
        let late = await wire.reply(2)
        #expect(!late.ok && late.body["code"] as? String == "timeout", "\(late.body)")
        await server.handle(Respond(id: 3, prompt: "probe", thread_id: "t"))
        #expect(await wire.reply(3).body["text"] as? String == "echo 2: probe")
    }

    /// The answer is ready after the deadline but before the watchdog (which looks every 50 ms)
    /// has stopped the call, as when a stopped core resumes: the deadline is checked at commit.
    @Test func theDeadlineIsCheckedAtCommitNotOnlyByTheWatchdog() async throws {
        for k in 0..<5 {
            let (server, wire) = pipeServer(EchoBackend())
            await server.handle(Respond(id: 1, prompt: "first", thread_id: "t"))
            #expect(await wire.reply(1).body["text"] as? String == "echo 1: first")
            await server.handle(Respond(id: 2, prompt: "!sleep 25 late", thread_id: "t", options: RespondOptions(timeout_s: 0.01)))
            let late = await wire.reply(2)
            #expect(!late.ok && late.body["code"] as? String == "timeout", "trial \(k): \(late.body)")
            await server.handle(Respond(id: 3, prompt: "probe", thread_id: "t"))
            #expect(await wire.reply(3).body["text"] as? String == "echo 2: probe", "trial \(k)")
        }
    }

    /// A request read after its deadline (the core was stopped while it queued) is answered
    /// `timeout` at once: it runs nothing, and a thread it would have created does not exist.
    @Test func aCallReadAfterItsDeadlineRunsNothingAndCreatesNoThread() async throws {
        let (server, wire) = pipeServer(EchoBackend())
        await server.handle(Respond(id: 1, prompt: "first", thread_id: "t"))
        #expect(await wire.reply(1).body["text"] as? String == "echo 1: first")
        let past = RespondOptions(timeout_s: 2, deadline: monotonicSeconds() - 0.001)
        await server.handle(Respond(id: 2, prompt: "late", thread_id: "t", options: past))
        await server.handle(Respond(id: 3, prompt: "late", thread_id: "new", options: past))
        for id in [2, 3] {
            let late = await wire.reply(id)
            #expect(!late.ok && late.body["code"] as? String == "timeout", "\(late.body)")
        }
        #expect(await server.registry.snapshot().map(\.thread_id) == ["t"])
        let ahead = RespondOptions(timeout_s: 2, deadline: monotonicSeconds() + 60)
        await server.handle(Respond(id: 4, prompt: "probe", thread_id: "t", options: ahead))
        #expect(await wire.reply(4).body["text"] as? String == "echo 2: probe")
    }

    @Test func aCancelThatCameFirstWinsOverAnAnswerThatCameAnyway() async throws {
        let gate = Gate()
        let (server, wire) = pipeServer(GateBackend(gate: gate))
        await server.handle(Respond(id: 1, prompt: "gate", thread_id: "t"))
        await gate.waitUntilEntered()
        await server.handle(Cancel(id: 2, request: 1))
        #expect(await wire.reply(2).body["cancelled"] as? Bool == true)
        gate.open()
        let stopped = await wire.reply(1)
        #expect(!stopped.ok && stopped.body["code"] as? String == "cancelled")
        // The creating call was cancelled: no thread is left, and the id starts afresh.
        #expect(await !server.registry.contains("t"))
        await server.handle(Respond(id: 3, prompt: "again", thread_id: "t"))
        let again = await wire.reply(3)
        #expect(again.body["created"] as? Bool == true && again.body["text"] as? String == "echo 1: again")
    }
}

/// What a lifecycle's exit saw: the status, when, and how many calls were still in flight.
struct Exit: Sendable {
    let status: Int32
    let at: ContinuousClock.Instant
    let callsLeft: Int
}

/// Starts a lifecycle on `server` whose exit is recorded instead of taken (its OS thread then
/// parks for good), runs `trigger` on it, and returns the exit.
func exitOf(_ server: PipeServer, _ escalation: Lifecycle.Escalation, input: Int32 = -1,
            _ trigger: @escaping @Sendable (Lifecycle) -> Void = { $0.inputEnded() }) async -> Exit {
    await withCheckedContinuation { (c: CheckedContinuation<Exit, Never>) in
        let lifecycle = Lifecycle(log: Log(level: .error), escalation: escalation) { status in
            c.resume(returning: Exit(status: status, at: .now, callsLeft: server.callsInFlight))
            while true { sleep(60) }
        }
        lifecycle.start(server: server, input: input)
        trigger(lifecycle)
    }
}

@Suite struct Shutdown {
    static func escalation(drain: Duration = .zero, cancel: Duration) -> Lifecycle.Escalation {
        Lifecycle.Escalation(steps: [.drain(drain), .cancel(cancel)], lastWords: .zero, backstopMargin: .seconds(1))
    }

    @Test func theShutdownEndsWithinItsTimeEvenWhenACallIgnoresCancellation() async throws {
        let gate = Gate()
        let (server, wire) = pipeServer(GateBackend(gate: gate))
        await server.handle(Respond(id: 1, prompt: "gate", thread_id: "wedged"))
        await gate.waitUntilEntered()
        let start = ContinuousClock.now
        let exit = await exitOf(server, Self.escalation(cancel: .milliseconds(300)))
        let took = seconds(exit.at - start)
        #expect(exit.status == 0)
        #expect(exit.callsLeft > 0, "the call ended, so this tested nothing")
        #expect(took >= 0.25 && took < 2, "took \(took) s")
        gate.open()
        #expect(await wire.reply(1).body["code"] as? String == "cancelled")
    }

    /// The calls are stopped by the cancel, not by its time running out: that time is far longer
    /// than the test, and the exit comes with no call left.
    @Test func theShutdownStopsCallsThatListenAndThoseAcceptedAfterIt() async throws {
        let (server, wire) = pipeServer(EchoBackend())
        await server.handle(Respond(id: 1, prompt: "!sleep 600000 long", thread_id: "t"))
        let exit = await exitOf(server, Self.escalation(cancel: .seconds(600)))
        #expect(exit.status == 0 && exit.callsLeft == 0)
        #expect(await wire.reply(1).body["code"] as? String == "cancelled")
        // A request the dispatcher takes after stdin closed starts stopped.
        await server.handle(Respond(id: 2, prompt: "!sleep 600000 late", thread_id: "u"))
        #expect(await wire.reply(2).body["code"] as? String == "cancelled")
    }

    /// The drain step lets the calls in flight finish: the cancel comes only once its time is up,
    /// and the exit as soon as no call is left (the cancel's own time is far longer than the test).
    @Test func aDrainLetsCallsFinishAndTheCancelComesAfterIt() async throws {
        let (server, wire) = pipeServer(EchoBackend())
        await server.handle(Respond(id: 1, prompt: "!sleep 200 short", thread_id: "a"))
        let drained = await exitOf(server, Self.escalation(drain: .seconds(600), cancel: .seconds(600)))
        #expect(drained.callsLeft == 0)
        #expect(await wire.reply(1).body["text"] as? String == "echo 1: !sleep 200 short")

        let (server2, wire2) = pipeServer(EchoBackend())
        await server2.handle(Respond(id: 1, prompt: "!sleep 600000 long", thread_id: "b"))
        let start = ContinuousClock.now
        let cancelled = await exitOf(server2, Self.escalation(drain: .milliseconds(400), cancel: .seconds(600)))
        let took = seconds(cancelled.at - start)
        #expect(cancelled.status == 0 && cancelled.callsLeft == 0)
        #expect(took >= 0.35, "took \(took) s: the cancel came before the drain's time was up")
        #expect(await wire2.reply(1).body["code"] as? String == "cancelled")
    }

    /// stdin hung up but the pipe loop never reports the end (a call stuck on it): the core
    /// exits anyway, the steps' time and the backstop's margin after the hang-up.
    @Test func theBackstopEndsACoreWhosePipeLoopNeverSawTheEnd() async throws {
        let (server, _) = pipeServer(EchoBackend())
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        let escalation = Lifecycle.Escalation(steps: [.cancel(.milliseconds(200))], lastWords: .zero, backstopMargin: .milliseconds(200))
        let start = ContinuousClock.now
        let exit = await exitOf(server, escalation, input: fds[0]) { [write = fds[1]] _ in close(write) }
        let took = seconds(exit.at - start)
        #expect(exit.status == 0)
        #expect(took >= 0.35 && took < 2, "took \(took) s")
        close(fds[0])
    }

    /// The first ending wins, with its status; one asked for after it waits for that exit (had
    /// it exited too, the recorded exit would be resumed twice, which traps).
    @Test func theFirstEndingWinsWithItsStatus() async throws {
        let (server, _) = pipeServer(EchoBackend())
        let ended = Locked<Lifecycle?>(nil)
        let exit = await exitOf(server, Self.escalation(cancel: .seconds(5))) { lifecycle in
            ended.withLock { $0 = lifecycle }
            Thread.detachNewThread { lifecycle.end(.protocolError) }
        }
        #expect(exit.status == 65)
        // An ending asked for once the first one has exited: it waits, and never exits again.
        let lifecycle = try #require(ended.withLock { $0 })
        Thread.detachNewThread { lifecycle.end(.crash) }
        try await Task.sleep(for: .milliseconds(200))
        #expect(Lifecycle.Ending.crash.status == 70 && Lifecycle.Ending.outputClosed.status == 0)
    }
}

/// A call's state and its transitions, on their own (the races above drive them through the server).
@Suite struct CallStates {
    static let task = Task<Void, Never> {}

    @Test func aCallStoppedBeforeItsTaskStartsHasTheTaskCancelledAsItStarts() {
        var call = CallState(deadline: nil, admitted: true)
        let stopped = call.stop(.cancelled)
        #expect(stopped == .stopped(nil))
        let cancelNow = call.started(Self.task)
        #expect(cancelNow, "the task was not to be cancelled")
        #expect(call.stage == .stopped(.cancelled, Self.task))
        let kept = call.commit(at: 0)
        #expect(!kept)
    }

    @Test func aRunningCallStopsOnceAndKeepsItsFirstReason() {
        var call = CallState(deadline: 10, admitted: true)
        let cancelNow = call.started(Self.task)
        #expect(!cancelNow)
        #expect(call.stage == .running(Self.task, deadline: 10))
        let stopped = call.stop(.timeout)
        #expect(stopped == .stopped(Self.task))
        let again = call.stop(.cancelled)
        #expect(again == .stopped(Self.task))
        #expect(call.stopReason == .timeout)
        #expect(call.deadline == nil && !call.isOverdue(at: 20), "a stopped call cannot time out again")
    }

    @Test func aCommittingCallIsTooLateToStop() {
        var call = CallState(deadline: 10, admitted: true)
        _ = call.started(Self.task)
        let kept = call.commit(at: 5)
        #expect(kept)
        let stopped = call.stop(.cancelled)
        #expect(stopped == .tooLate)
        #expect(call.stage == .committing && call.stopReason == nil && !call.isOverdue(at: 20))
    }

    /// The deadline is checked when the turn would be committed, whether or not the watchdog looked.
    @Test func aCallPastItsDeadlineAtTheCommitIsStoppedAsTimedOut() {
        var call = CallState(deadline: 10, admitted: true)
        _ = call.started(Self.task)
        #expect(!call.isOverdue(at: 9.9) && call.isOverdue(at: 10))
        let kept = call.commit(at: 10)
        #expect(!kept)
        #expect(call.stage == .stopped(.timeout, Self.task))
    }

    @Test func aCallReadDuringTheShutdownStartsStopped() {
        var call = CallState(deadline: 10, admitted: false)
        #expect(call.stopReason == .cancelled && call.deadline == nil)
        let cancelNow = call.started(Self.task)
        #expect(cancelNow)
    }

    /// On the global pool the task may reach its commit before the server records it as started.
    @Test func aTaskThatReachedItsCommitBeforeItWasRecordedIsLeftAlone() {
        var call = CallState(deadline: nil, admitted: true)
        let kept = call.commit(at: 0)
        #expect(kept)
        let cancelNow = call.started(Self.task)
        #expect(!cancelNow)
        #expect(call.stage == .committing)
    }

    @Test func aSecondStartTraps() async {
        await #expect(processExitsWith: .failure) {
            var call = CallState(deadline: nil, admitted: true)
            _ = call.started(Task {})
            _ = call.started(Task {})
        }
    }

    @Test func aSecondCommitTraps() async {
        await #expect(processExitsWith: .failure) {
            var call = CallState(deadline: nil, admitted: true)
            _ = call.commit(at: 0)
            _ = call.commit(at: 0)
        }
    }
}
