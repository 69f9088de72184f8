import Foundation

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

/// Logs to stderr, never stdout: stdout carries protocol bytes only.
public struct Log: Sendable {
    public var level: LogLevel

    public init(level: LogLevel) { self.level = level }

    public func callAsFunction(_ level: LogLevel, _ message: @autoclosure () -> String) {
        guard level >= self.level else { return }
        FileHandle.standardError.write(Data("wisp-core \(level.rawValue): \(message())\n".utf8))
    }
}
