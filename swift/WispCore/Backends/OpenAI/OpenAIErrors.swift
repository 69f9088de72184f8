#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// The error dialects of OpenAI-compatible servers and their transports, as `WispError`s.
extension OpenAIServer {
    /// An HTTP error answer, as a WispError naming the endpoint. Overflow is recognised in all its known forms.
    /// `reasoning`: the request carried `reasoning_effort` for this level; a refusal that speaks of
    /// reasoning names the field (the call is not retried without it: the caller asked for it).
    func httpError(_ status: Int, _ body: Data, reasoning: ReasoningLevel? = nil) -> WispError {
        let message = Self.errorMessage(body) ?? String(decoding: body.prefix(500), as: UTF8.self)
        if Self.isOverflow(body) {
            return WispError(.contextOverflow, "the conversation does not fit in the model's context (\(message))")
        }
        let at = "the model server at \(endpointDescription)"
        if let reasoning, [400, 422].contains(status), message.lowercased().contains("reasoning") {
            return WispError(.invalidArgument, """
                reasoning: \(at) refused `reasoning_effort` ("\(Self.reasoningEffort(reasoning))", sent for reasoning \
                '\(reasoning.rawValue)') with HTTP \(status): \(message). Omit `reasoning` for this model.
                """)
        }
        switch status {
        case 401, 403:
            return WispError(.modelUnavailable,
                             "\(at) refused the credentials (HTTP \(status)): check WISP_API_KEY. \(message)")
        case 404:
            return WispError(.modelUnavailable,
                    "\(at) has no such model or path (HTTP 404): check --model, and that --endpoint is the API base " +
                    "(usually ending in /v1). \(message)")
        case 429:
            return WispError(.busy, "\(at) is rate-limiting requests (HTTP 429): \(message)")
        case 503:
            return WispError(.modelUnavailable,
                             "\(at) is not ready (HTTP 503, e.g. still loading the model): \(message)")
        case 500...:
            return WispError(.generationFailed, "\(at) failed (HTTP \(status)): \(message)")
        case 200..<300:
            return WispError(.generationFailed, "\(at) reported an error while generating: \(message)")
        default:
            return WispError(.generationFailed, "\(at) rejected the request (HTTP \(status)): \(message)")
        }
    }

    /// llama.cpp `exceed_context_size_error`; llama-cpp-python and OpenAI `context_length_exceeded`;
    /// vLLM and others: "maximum context length" in the message; LM Studio: "Trying to keep the
    /// first N tokens when context the overflows" (its words).
    static func isOverflow(_ body: Data) -> Bool {
        if let object = JSONObjects.object(body) as? [String: Any] {
            let error = object["error"] as? [String: Any] ?? object
            if (error["type"] as? String) == "exceed_context_size_error" { return true }
            if (error["code"] as? String) == "context_length_exceeded" { return true }
            let message = ((error["message"] as? String) ?? (object["error"] as? String) ?? "").lowercased()
            return message.contains("maximum context length") || message.contains("exceeds the available context size")
                || message.contains("context length exceeded") || message.contains("context_length_exceeded")
                || message.contains("when context the overflows") || message.contains("when context overflows")
        }
        let text = String(decoding: body.prefix(2000), as: UTF8.self).lowercased()
        return text.contains("context_length_exceeded") || text.contains("exceed_context_size_error")
    }

    static func errorMessage(_ body: Data) -> String? {
        guard let object = JSONObjects.object(body) as? [String: Any] else {
            let text = String(decoding: body.prefix(300), as: UTF8.self).trimmingWhitespace()
            return text.isEmpty ? nil : text
        }
        if let error = object["error"] as? [String: Any], let m = error["message"] as? String { return m }
        if let m = object["error"] as? String { return m }
        if let m = object["message"] as? String { return m }
        if let m = object["detail"] as? String { return m }
        return nil
    }

    /// A transport failure (no HTTP answer, or one that cannot be read), as a WispError naming the endpoint.
    func mapTransport(_ error: any Error, what: String) -> WispError {
        if let e = error as? WispError { return e }
        if error is CancellationError { return .callCancelled }
        let at = "the model server at \(endpointDescription)"
        guard let failure = error as? HTTPError else {
            return WispError(.modelUnavailable, "could not \(what) \(at): \(error)")
        }
        let detail = failure.detail
        switch failure.kind {
        case .cannotConnect, .cannotFindHost:
            return WispError(.modelUnavailable,
                    "could not \(what) \(at): connection refused or host not found (\(detail)); is the server running?")
        case .timedOut:
            return WispError(.generationFailed, "\(at) stopped sending for too long (timed out): \(detail)")
        case .connectionLost:
            return WispError(.generationFailed, "\(at) closed the connection mid-answer (did it crash?): \(detail)")
        case .cancelled:
            return .callCancelled
        case .certificateRejected, .tlsFailed, .tlsUnavailable, .malformedResponse, .tooLarge, .invalidRequest:
            return WispError(.modelUnavailable, "could not \(what) \(at): \(detail)")
        }
    }
}
