/// One call's state in the pipe server, from the moment its request id is taken to its reply.
/// Each stage holds what it needs, and the transitions below are the only way to change it;
/// the server runs them under one lock, so a cancel, the time limit and the commit decision
/// are taken one at a time. A transition the server never makes traps in a debug build.
struct CallState {
    enum Stage: Equatable {
        /// Taken; its schema and its thread are being prepared, and it has no task yet.
        case preparing(deadline: Double?)
        /// Its task runs (or waits for its turn on the thread).
        case running(Task<Void, Never>, deadline: Double?)
        /// Stopped (`cancelled` or `timeout`) before its turn was committed: the first reason
        /// stays. Its task, once it has one.
        case stopped(WispError.Code, Task<Void, Never>?)
        /// Its turn is being committed: too late to stop it.
        case committing
    }

    /// What `stop` did.
    enum Stop: Equatable {
        /// The call is stopped; its task, if it has one, is to be cancelled.
        case stopped(Task<Void, Never>?)
        /// Its turn is being committed: it ends as if the stop had come after its reply.
        case tooLate
    }

    private(set) var stage: Stage

    /// `deadline`: when the call's time limit runs out, in `monotonicSeconds()`. A call that is
    /// not `admitted` (read once the shutdown began) starts stopped.
    init(deadline: Double?, admitted: Bool) {
        stage = admitted ? .preparing(deadline: deadline) : .stopped(.cancelled, nil)
    }

    /// The call's task has started. True when it must be cancelled at once (it was stopped first).
    mutating func started(_ task: Task<Void, Never>) -> Bool {
        switch stage {
        case .preparing(let deadline):
            stage = .running(task, deadline: deadline)
            return false
        case .stopped(let code, nil):
            stage = .stopped(code, task)
            return true
        case .committing:
            // Its task ran on the global pool (no pipe loop: unit tests) and reached its commit first.
            return false
        case .running, .stopped(_, .some):
            assertionFailure("a call's task starts once")
            return false
        }
    }

    mutating func stop(_ code: WispError.Code) -> Stop {
        switch stage {
        case .preparing:
            stage = .stopped(code, nil)
            return .stopped(nil)
        case .running(let task, _):
            stage = .stopped(code, task)
            return .stopped(task)
        case .stopped(_, let task):
            return .stopped(task)
        case .committing:
            return .tooLate
        }
    }

    /// Asked once the model has answered: true (and `committing`) when the turn is to be kept,
    /// false when the call was stopped first or its deadline has passed by `now` (it is then
    /// stopped as timed out, whether or not the watchdog has looked).
    mutating func commit(at now: Double) -> Bool {
        switch stage {
        case .preparing(let deadline?) where deadline <= now:
            stage = .stopped(.timeout, nil)
            return false
        case .running(let task, let deadline?) where deadline <= now:
            stage = .stopped(.timeout, task)
            return false
        case .preparing, .running:
            stage = .committing
            return true
        case .stopped:
            return false
        case .committing:
            assertionFailure("a call's turn is committed once")
            return true
        }
    }

    /// Why the call was stopped, if it was.
    var stopReason: WispError.Code? {
        if case .stopped(let code, _) = stage { return code }
        return nil
    }

    /// The deadline of a call that can still time out (not stopped, not committing).
    var deadline: Double? {
        switch stage {
        case .preparing(let deadline), .running(_, let deadline): deadline
        case .stopped, .committing: nil
        }
    }

    /// Whether the call can still time out and its deadline has passed by `now`.
    func isOverdue(at now: Double) -> Bool { deadline.map { $0 <= now } ?? false }
}
