/// `close_thread`: frees a thread and deletes it from the store (ThreadRegistry.swift says what
/// closing does); an unknown id is no error (`closed: false`).
public struct CloseThread: AnsweredOperation, Codable {
    public typealias Result = CloseThreadResult
    public static let op = "close_thread"
    public var id: Int
    public var thread_id: String

    public static let fields = PipeFields<Self>([
        .constant("op", op),
        .field("id", \.id),
        .field("thread_id", \.thread_id),
    ])
    public static let blank = CloseThread(id: 0, thread_id: "")

    // Answered in order, not aside: a `respond` read after it must find the thread closed.
    public func run(on server: PipeServer) async throws(WispError) -> CloseThreadResult {
        CloseThreadResult(thread_id: thread_id, closed: try await server.registry.close(thread_id))
    }
}

public struct CloseThreadResult: PipeMessage, Codable, Sendable, Equatable {
    var op = CloseThread.op
    public var thread_id: String
    public var closed: Bool

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
        .field("thread_id", \.thread_id),
        .field("closed", \.closed),
    ])
    public static let blank = CloseThreadResult(thread_id: "", closed: false)
}
