/// What a thread's memory is to its store: the one state its loads, commits, listings and
/// eviction decide by. Closed is final: `settle` never leaves it, so a thread closed while a
/// call loaded or stored it stays closed (that call deletes what is stored, under its lease).
enum StoreState: Sendable, Equatable {
    /// A fork whose first call has not committed: that call creates the thread for its caller,
    /// and stores it whole (nothing stored under its id is its).
    case fork
    /// The memory is what the store holds at this version (nil: none seen, or deleted).
    case inStep(StoreVersion?)
    /// Turns were committed that the store does not have (it could not be written) since this
    /// version: the memory is newer than anything stored, so the next call stores it whole
    /// rather than reloading, and the registry never evicts the thread meanwhile.
    case ahead(of: StoreVersion?)
    /// Closed: calls still running on it must not store it again.
    case closed

    /// The stored version this memory last loaded or wrote (nil: none seen).
    var version: StoreVersion? {
        switch self {
        case .inStep(let version), .ahead(of: let version): version
        case .fork, .closed: nil
        }
    }

    var holdsUnstoredTurns: Bool {
        if case .ahead = self { true } else { false }
    }

    var isInStep: Bool {
        if case .inStep = self { true } else { false }
    }

    mutating func settle(_ next: StoreState) {
        if self != .closed { self = next }
    }
}
