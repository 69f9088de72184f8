/// `ping`, a liveness check: answered at once by the dispatcher, without touching the registry
/// or a backend, so a reply proves the core still reads and runs its dispatcher.
public struct Ping: AnsweredOperation, Codable {
    public typealias Result = PingResult
    public static let op = "ping"
    public var id: Int

    public static let fields = PipeFields<Self>([
        .constant("op", op),
        .field("id", \.id),
    ])
    public static let blank = Ping(id: 0)

    public func run(on server: PipeServer) async throws(WispError) -> PingResult { PingResult() }
}

public struct PingResult: PipeMessage, Codable, Sendable, Equatable {
    var op = Ping.op

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
    ])
    public static let blank = PingResult()
}
