import WispInfrastructure

/// One turn at a time, in arrival order: a line of numbered tickets, the turn handed by each
/// holder to the next ticket still in line.
///
/// A ticket is taken when a call is accepted and waited on when the call is ready to run, so the
/// order is the order of acceptance however the calls' tasks are scheduled. A waiter leaves the
/// line without the turn when its task is cancelled or its deadline passes; a ticket that left is
/// skipped when the turn reaches it. Every step is decided under one lock, so a waiter that
/// leaves at the moment the turn is handed to it either got the turn or left, never both: it
/// learns which from the value its wait is resumed with.
///
/// Locked rather than an actor so that the cancellation handler (which runs on whatever thread
/// cancels) leaves the line at once, and so that the thread actor asks `pending` without a hop.
public final class TicketGate: Sendable {
    /// A place in the line.
    public struct Ticket: Sendable, Equatable {
        let number: UInt64
    }

    /// Why a waiter left the line without its turn.
    public enum Exit: Error, Sendable, Equatable {
        case cancelled
        case timedOut
    }

    /// The line already has `waiting` tickets waiting behind the holder.
    public struct Full: Error, Sendable {
        public let waiting: Int
    }

    /// Told how many tickets are ahead of a waiter (the holder's included), when it starts
    /// waiting and whenever that changes.
    public typealias PlaceHandler = @Sendable (_ ahead: Int) -> Void

    /// The ticket issued with the gate: it holds the turn from the start, so that creating what
    /// the gate guards and accepting its first call is one step.
    public static let first = Ticket(number: 0)

    private typealias Waiter = CheckedContinuation<Exit?, Never>

    private struct Line: Sendable {
        var issued: UInt64 = 1
        var serving: UInt64 = 0
        /// Waiters by ticket, each resumed with nil when its turn comes or with why it left.
        var parked: [UInt64: Waiter] = [:]
        /// Tickets that left before their turn; skipped when it comes.
        var left: Set<UInt64> = []
        var watchers: [UInt64: PlaceReporter] = [:]

        /// Tickets not yet done: the holder and those waiting.
        var pending: Int { Int(issued - serving) - left.count }

        func ahead(of number: UInt64) -> Int {
            Int(number - serving) - left.count { $0 > serving && $0 < number }
        }
    }

    private let line = Locked(Line())

    public init() {}

    /// Tickets not yet done: the holder and those waiting.
    public var pending: Int { line.withLock { $0.pending } }

    /// A place at the end of the line, unless `maxWaiting` tickets already wait behind the holder.
    public func take(maxWaiting: Int) throws(Full) -> Ticket {
        let taken: Result<Ticket, Full> = line.withLock { line in
            let waiting = max(line.pending - 1, 0)
            guard line.pending == 0 || waiting < maxWaiting else { return .failure(Full(waiting: waiting)) }
            defer { line.issued += 1 }
            return .success(Ticket(number: line.issued))
        }
        return try taken.get()
    }

    /// Returns when `ticket` holds the turn; the caller then must `release` it exactly once.
    /// Throws when the ticket left the line instead (its task was cancelled, or `deadline`, in
    /// `monotonicSeconds()`, passed): it never holds the turn then, and is not released.
    /// A ticket that already holds the turn gets it whatever its task's state or deadline.
    public func wait(for ticket: Ticket, deadline: Double? = nil, onPlace: PlaceHandler? = nil,
                     isolation: isolated (any Actor)? = #isolation) async throws(Exit) {
        if line.withLock({ $0.serving == ticket.number }) { return }
        var timer: Task<Void, Never>?
        // What the wait ends with is decided where the waiter is resumed, under the lock, and
        // handed to it: the line's state when it runs again may have moved on (its ticket skipped).
        let exit: Exit? = await withTaskCancellationHandler {
            await withCheckedContinuation(isolation: isolation) { (waiter: Waiter) in
                let reporter = onPlace.map(PlaceReporter.init)
                guard let ahead = park(ticket, waiter, deadline: deadline, reporter: reporter) else { return }
                reporter?.report(ahead)
                timer = deadline.flatMap { expire(ticket, at: $0) }
            }
        } onCancel: {
            self.leave(ticket, because: .cancelled)
        }
        timer?.cancel()
        if let exit { throw exit }
    }

    /// Waits `ticket` in line and gives its place, or resumes it at once when its turn has come or
    /// it must leave (cancelled, or past `deadline`) and gives nil.
    private func park(_ ticket: Ticket, _ waiter: Waiter, deadline: Double?, reporter: PlaceReporter?) -> Int? {
        let number = ticket.number
        let parking: Parking = line.withLock { line in
            if line.serving == number { return .resumed(nil) }
            let exit: Exit? = Task.isCancelled ? .cancelled
                : deadline.map { $0 <= monotonicSeconds() } == true ? .timedOut : nil
            if let exit {
                line.left.insert(number)
                return .resumed(exit)
            }
            line.parked[number] = waiter
            line.watchers[number] = reporter
            return .waiting(ahead: line.ahead(of: number))
        }
        switch parking {
        case .waiting(let ahead): return ahead
        case .resumed(let exit):
            waiter.resume(returning: exit)
            return nil
        }
    }

    private enum Parking {
        case waiting(ahead: Int)
        /// The wait ends as it starts: nil, with the turn; else with why the ticket left.
        case resumed(Exit?)
    }

    /// The timer that takes `ticket` out of the line at `deadline`; none for a deadline no timer
    /// can be set for (a hostile one, years ahead): the call's own time limit still stops it.
    private func expire(_ ticket: Ticket, at deadline: Double) -> Task<Void, Never>? {
        let seconds = deadline - monotonicSeconds()
        guard seconds.isFinite, seconds < Self.longestTimer else { return nil }
        return Task {
            do {
                try await Task.sleep(for: .seconds(max(seconds, 0)))
            } catch {
                return
            }
            self.leave(ticket, because: .timedOut)
        }
    }

    /// A day: longer than any time limit a call is given.
    private static let longestTimer: Double = 86_400

    /// Hands the turn from `ticket`, its holder, to the next ticket still in line. A ticket that
    /// does not hold the turn is ignored: it has nothing to hand over.
    public func release(_ ticket: Ticket) {
        let (next, told) = line.withLock { line -> (Waiter?, [(PlaceReporter, Int)]) in
            guard ticket.number == line.serving else { return (nil, []) }
            line.serving += 1
            while line.left.remove(line.serving) != nil { line.serving += 1 }
            let told = line.watchers.compactMap { number, watcher in
                number >= line.serving ? (watcher, line.ahead(of: number)) : nil
            }
            line.watchers[line.serving] = nil
            return (line.parked.removeValue(forKey: line.serving), told)
        }
        next?.resume(returning: nil)
        for (reporter, ahead) in told { reporter.report(ahead) }
    }

    /// Takes a waiting ticket out of the line (its task was cancelled, or its deadline passed).
    /// Nothing happens to a ticket that is not waiting: one that holds the turn keeps it.
    func leave(_ ticket: Ticket, because exit: Exit) {
        let waiter = line.withLock { line -> Waiter? in
            guard let waiter = line.parked.removeValue(forKey: ticket.number) else { return nil }
            line.left.insert(ticket.number)
            line.watchers[ticket.number] = nil
            return waiter
        }
        waiter?.resume(returning: exit)
    }
}

/// A waiter's place, reported only as it falls. Places are counted under the line's lock but
/// reported outside it (a handler must not run under the line's lock), so the report made when a
/// waiter parks and one made by a release just after can arrive in either order; a place never
/// grows while a ticket waits, so the larger of two crossed reports is the stale one and is dropped.
/// Reporting under this waiter's own lock keeps its handler's calls in the order they were judged.
final class PlaceReporter: Sendable {
    private let lowest = Locked(Int.max)
    private let handler: TicketGate.PlaceHandler

    init(_ handler: @escaping TicketGate.PlaceHandler) { self.handler = handler }

    func report(_ ahead: Int) {
        lowest.withLock { lowest in
            guard ahead < lowest else { return }
            lowest = ahead
            handler(ahead)
        }
    }
}
