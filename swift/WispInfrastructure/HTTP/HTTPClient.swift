import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization

/// A response as events: the status first, then body bytes as they arrive.
public enum HTTPEvent: Sendable {
    case response(Int)
    case data(Data)
}

/// One long-lived `URLSession` whose delegate feeds each task's events into that task's
/// `AsyncThrowingStream` (Linux has no `bytes(for:)`). Ending a stream early (Task
/// cancellation, or the consumer leaving) cancels its request, which closes the connection.
/// Long-lived on purpose: short-lived sessions are a known crash on Linux after https
/// requests (swift-corelibs-foundation #5203), and a session per backend keeps connections alive.
public final class HTTPClient: Sendable {
    private let router = HTTPRouter()
    private let session: URLSession

    /// `idleTimeout`: how long a request may go without receiving anything.
    public init(idleTimeout: TimeInterval) {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = idleTimeout
        configuration.urlCache = nil
        // Every live thread may stream at once (--max-threads); the default 6 would queue them.
        configuration.httpMaximumConnectionsPerHost = 64
        session = URLSession(configuration: configuration, delegate: router, delegateQueue: nil)
    }

    deinit { session.invalidateAndCancel() }

    /// The one choice of transport: what carries a plain `http://` request (a local model
    /// server) instead of the session, nil for the session. On Linux the plain client
    /// (PlainHTTP.swift), because swift-corelibs-foundation's URLSession spins while it waits for
    /// a streamed answer; elsewhere, and for every other scheme everywhere, URLSession.
    static let plainTransport: (@Sendable (URLRequest) -> AsyncThrowingStream<HTTPEvent, any Error>)? = {
        #if os(Linux)
        return PlainHTTP.open
        #else
        return nil
        #endif
    }()

    public func open(_ request: URLRequest) -> AsyncThrowingStream<HTTPEvent, any Error> {
        if let plain = Self.plainTransport, request.url?.scheme?.lowercased() == "http" { return plain(request) }
        let (stream, continuation) = AsyncThrowingStream<HTTPEvent, any Error>.makeStream()
        let task = session.dataTask(with: request)
        let id = task.taskIdentifier
        router.add(id, continuation)
        continuation.onTermination = { [router] _ in
            router.remove(id)
            task.cancel()
        }
        task.resume()
        return stream
    }
}

/// The session's delegate: routes events to the stream of the task they belong to.
final class HTTPRouter: NSObject, URLSessionDataDelegate, Sendable {
    private let streams = Mutex<[Int: AsyncThrowingStream<HTTPEvent, any Error>.Continuation]>([:])

    func add(_ id: Int, _ continuation: AsyncThrowingStream<HTTPEvent, any Error>.Continuation) {
        streams.withLock { $0[id] = continuation }
    }

    func remove(_ id: Int) {
        _ = streams.withLock { $0.removeValue(forKey: id) }
    }

    private func stream(_ id: Int) -> AsyncThrowingStream<HTTPEvent, any Error>.Continuation? {
        streams.withLock { $0[id] }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
        stream(dataTask.taskIdentifier)?.yield(.response((response as? HTTPURLResponse)?.statusCode ?? 0))
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        stream(dataTask.taskIdentifier)?.yield(.data(data))
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let continuation = streams.withLock({ $0.removeValue(forKey: task.taskIdentifier) }) else { return }
        if let error { continuation.finish(throwing: error) } else { continuation.finish() }
    }
}
