import WispInfrastructure

/// The one error type that crosses the pipe. Its codes are the pipe protocol's (ARCHITECTURE.md),
/// so every failure, from a bad thread id to a model refusal, reaches the caller as a code
/// the shim can map and a message a person can act on.
public struct WispError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable, Codable, CaseIterable {
        case invalidArgument = "invalid_argument"
        case contextOverflow = "context_overflow"
        case modelUnavailable = "model_unavailable"
        case generationFailed = "generation_failed"
        /// A reply that does not match the call's `schema` (or was cut off before it could).
        case invalidOutput = "invalid_output"
        /// A reply too large for the pipe once encoded; its turn was not kept.
        case replyTooLarge = "reply_too_large"
        case cancelled
        case timeout
        case busy
        /// The shared store (`--store`) cannot be reached: nothing of the call was kept anywhere.
        case storeUnavailable = "store_unavailable"
        case `internal`
    }

    public var code: Code
    public var message: String

    /// Bytes a message may have, the cut mark included. Each message bounds what it quotes
    /// (`String.preview`); this holds for the ones that quote a whole text from outside (a
    /// server's error) and for any that forgets, so no error can carry a megabyte back.
    public static let maxMessageBytes = 4096

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message.bounded(toBytes: Self.maxMessageBytes)
    }

    public var description: String { "\(code.rawValue): \(message)" }

    /// A call stopped by cancellation, wherever it was stopped.
    public static let callCancelled = WispError(.cancelled, "The call was cancelled.")
    /// A call cancelled before its turn on the thread came.
    public static let cancelledWhileWaiting = WispError(.cancelled,
                                                        "The call was cancelled while waiting for its thread.")
    /// A call whose time limit ran out before its turn on the thread came.
    public static let timedOutWhileWaiting = WispError(.timeout,
                                                       "The call's time limit ran out while it waited for its thread.")

    /// Any error, as a WispError: Swift cancellation becomes `cancelled`, anything foreign `internal`.
    public static func from(_ error: any Error) -> WispError {
        if let e = error as? WispError { return e }
        if error is CancellationError { return .callCancelled }
        return WispError(.internal, String(describing: error))
    }
}
