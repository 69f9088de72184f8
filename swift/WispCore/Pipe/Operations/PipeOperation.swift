import WispInfrastructure

/// The pipe's operations: what a shim → core request may ask, each one file in this directory
/// (its request and field table, its result, how it runs), and `PipeOperations.all`, the one
/// list the pipe reader's op map, the names in the core's facts and the dispatch come from.
/// CONTRIBUTING.md ("Adding a thread operation") has the recipe.

/// A request the pipe reads, tagged by its `op`, and what the core does with it.
public protocol PipeOperation: PipeMessage, Sendable, Equatable {
    /// What an ok reply to it carries, tagged by the same `op`.
    associatedtype Result: PipeMessage & Codable & Sendable
    /// The `op` its requests and results carry.
    static var op: String { get }
    /// The request's own id: its reply and events carry it.
    var id: Int { get }
    /// Serves the request. The dispatcher awaits it before it serves the next request, so an
    /// operation that must not hold the line (it waits on a disk or a backend) returns early.
    func serve(on server: PipeServer) async
}

/// An operation answered by what one `run` returns, or by its error: every one but `respond`,
/// whose call has a life of its own (events, a time limit, a cancel; `PipeServer`).
public protocol AnsweredOperation: PipeOperation {
    /// Run in a task of its own, so the requests after it are served meanwhile; false: answered
    /// before the next request is served (the reply keeps its place among theirs).
    static var runsAside: Bool { get }
    func run(on server: PipeServer) async throws(WispError) -> Result
}

extension AnsweredOperation {
    public static var runsAside: Bool { false }

    public func serve(on server: PipeServer) async {
        if Self.runsAside {
            Task { await server.answer(self) }
        } else {
            await server.answer(self)
        }
    }
}

public enum PipeOperations {
    /// Every operation, in the order the core declares them (stated in its facts as `operations`).
    public static let all: [any PipeOperation.Type] = [
        Respond.self, CloseThread.self, Cancel.self, Status.self, ReadThread.self, Ping.self,
    ]

    public static let names = all.map { $0.op }

    typealias Reader = @Sendable (inout JSONReader) throws(JSONError) -> any PipeOperation

    /// The pipe reader's op map: a request's reader by its `op`.
    static let readers: [String: Reader] = Dictionary(uniqueKeysWithValues: all.map { type in
        (type.op, { @Sendable (r: inout JSONReader) throws(JSONError) -> any PipeOperation in try type.read(&r) })
    })

    /// The operation `op` names, or an error that lists them all.
    static func reader(_ r: inout JSONReader) throws(JSONError) -> Reader {
        let name = try r.string()
        guard let read = readers[name] else {
            let listed = names.dropLast().joined(separator: ", ") + " or " + names.last!
            throw JSONError("unknown op '\(name.preview)' (\(listed))", at: -1)
        }
        return read
    }
}

/// Any shim → core request, as the pipe reader hands it on.
public struct Request: Sendable, Equatable {
    public let operation: any PipeOperation

    public init(_ operation: any PipeOperation) { self.operation = operation }

    public var id: Int { operation.id }

    public static func == (a: Request, b: Request) -> Bool { a.operation.isSame(as: b.operation) }
}

extension PipeOperation {
    func isSame(as other: any PipeOperation) -> Bool { (other as? Self) == self }
}
