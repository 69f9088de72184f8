import WispInfrastructure

public enum LogLevel: String, Sendable, Comparable {
    case debug, info, warning, error

    private var rank: Int {
        switch self {
        case .debug: 0
        case .info: 1
        case .warning: 2
        case .error: 3
        }
    }

    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rank < b.rank }
}

/// Logs to stderr, never stdout: stdout carries protocol bytes only. A line is queued, never
/// written by the caller (see `LogSink`), so no protocol work ever waits on stderr.
public struct Log: Sendable {
    public var level: LogLevel

    public init(level: LogLevel) { self.level = level }

    public func callAsFunction(_ level: LogLevel, _ message: @autoclosure () -> String) {
        guard level >= self.level else { return }
        LogSink.shared.post("wisp-core \(level.rawValue): \(message())")
    }

    /// Waits at most `within` for the lines queued so far to reach stderr: before the process
    /// exits, so that its last words are not lost when stderr is read.
    public static func flush(within: Duration) {
        LogSink.shared.flush(within: within)
    }
}
