/// `cancel`: stops the `respond` call whose id it names (`PipeServer.stop` says when it is too late).
public struct Cancel: AnsweredOperation, Codable {
    public typealias Result = CancelResult
    public static let op = "cancel"
    public var id: Int
    /// The id of the in-flight request to cancel.
    public var request: Int

    public static let fields = PipeFields<Self>([
        .constant("op", op),
        .field("id", \.id),
        .field("request", \.request),
    ])
    public static let blank = Cancel(id: 0, request: 0)

    public func run(on server: PipeServer) async throws(WispError) -> CancelResult {
        CancelResult(cancelled: server.stop(request, because: .cancelled))
    }
}

public struct CancelResult: PipeMessage, Codable, Sendable, Equatable {
    var op = Cancel.op
    /// False when the request had already finished or was never seen.
    public var cancelled: Bool

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
        .field("cancelled", \.cancelled),
    ])
    public static let blank = CancelResult(cancelled: false)
}
