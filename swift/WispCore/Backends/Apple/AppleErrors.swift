// Apple's model errors as WispErrors, the macOS 26 and 27 families (AppleBackend.swift says how
// this folder is checked without a Mac).
#if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
import Foundation
import WispInfrastructure
import FoundationModels

@available(macOS 26.0, *)
extension AppleBackend {
    /// Any error from FoundationModels as a WispError. An overflow becomes `context_overflow`,
    /// which starts the core's condensing; the rest name what happened and what to do.
    static func wispError(from error: any Error) -> WispError {
        if let e = error as? WispError { return e }
        if error is CancellationError { return .callCancelled }
        // Built with the 27 SDK (FoundationModels 2.x), a 27 runtime throws the new types;
        // a 26 runtime still throws GenerationError, handled below.
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, *), let e = wispError27(from: error) { return e }
        #endif
        if let e = error as? LanguageModelSession.GenerationError { return wispError(from: e) }
        if let e = error as? LanguageModelSession.ToolCallError {
            if e.underlyingError is CancellationError { return .callCancelled }
            return WispError(.generationFailed,
                             "tool '\(e.tool.name)' failed: \(e.underlyingError.localizedDescription)")
        }
        let ns = error as NSError
        return WispError(.generationFailed,
                         "Apple's model failed (\(ns.domain) \(ns.code)): \(ns.localizedDescription)")
    }

    /// A reply the framework could not decode into the requested structure.
    static func isDecodingFailure(_ error: any Error) -> Bool {
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, *), error is GeneratedContent.ParsingError { return true }
        #endif
        if let e = error as? LanguageModelSession.GenerationError, case .decodingFailure = e { return true }
        return false
    }

    /// The macOS 26 error family (deprecated in the 27 SDK, still thrown on 26 runtimes).
    static func wispError(from error: LanguageModelSession.GenerationError) -> WispError {
        switch error {
        case .exceededContextWindowSize(let c):
            WispError(.contextOverflow,
                      "The conversation no longer fits in the model's context window. (\(c.debugDescription))")
        case .assetsUnavailable(let c):
            WispError(.modelUnavailable,
                    "Apple's on-device model assets are not available (downloading or removed); try again in a few " +
                    "minutes. (\(c.debugDescription))")
        case .guardrailViolation(let c):
            WispError(.generationFailed,
                    "guardrail: Apple's safety guardrails blocked the prompt " +
                    "or the reply; rephrase it. (\(c.debugDescription))")
        case .refusal(_, let c):
            WispError(.generationFailed,
                      "refusal: the model declined to answer; rephrase the request. (\(c.debugDescription))")
        case .unsupportedLanguageOrLocale(let c):
            WispError(.generationFailed,
                    "unsupported language: the model does not support this language or locale. (\(c.debugDescription))")
        case .unsupportedGuide(let c):
            WispError(.generationFailed,
                    "unsupported guide: a generation guide in a tool schema is not supported. (\(c.debugDescription))")
        case .decodingFailure(let c):
            WispError(.generationFailed,
                      "decoding failure: the model's output could not be decoded. (\(c.debugDescription))")
        case .rateLimited(let c):
            WispError(.busy,
                    "Apple's model is rate-limited (this happens to background " +
                    "processes); try again shortly. (\(c.debugDescription))")
        case .concurrentRequests(let c):
            WispError(.busy, "This session is already answering a request. (\(c.debugDescription))")
        @unknown default:
            WispError(.generationFailed, "Apple's model failed: \(error.localizedDescription)")
        }
    }

    #if canImport(FoundationModels, _version: 2.0)
    /// The macOS 27 error family; nil when `error` is none of them.
    @available(macOS 27.0, *)
    static func wispError27(from error: any Error) -> WispError? {
        if let e = error as? LanguageModelError {
            switch e {
            case .contextSizeExceeded(let i):
                return WispError(.contextOverflow,
                        "The conversation no longer fits in the model's context " +
                        "window (\(i.tokenCount) tokens, window \(i.contextSize)).")
            case .rateLimited(let i):
                let retry = i.resetDate.map { " after \($0)" } ?? " shortly"
                return WispError(.busy, "Apple's model is rate-limited; try again\(retry). (\(i.debugDescription))")
            case .guardrailViolation(let i):
                return WispError(.generationFailed,
                        "guardrail: Apple's safety guardrails blocked the prompt " +
                        "or the reply; rephrase it. (\(i.debugDescription))")
            case .refusal(let i):
                return WispError(.generationFailed,
                                 "refusal: the model declined to answer; rephrase the request. (\(i.debugDescription))")
            case .unsupportedLanguageOrLocale(let i):
                return WispError(.generationFailed,
                        "unsupported language: the model does not support " +
                        "'\(i.languageCode.identifier)'. (\(i.debugDescription))")
            case .unsupportedGenerationGuide(let i):
                return WispError(.generationFailed,
                        "unsupported guide: a generation guide in a tool " +
                        "schema is not supported. (\(i.debugDescription))")
            case .unsupportedCapability(let i):
                return WispError(.generationFailed,
                                 "unsupported capability: the model cannot do what was asked. (\(i.debugDescription))")
            case .unsupportedTranscriptContent(let i):
                return WispError(.internal,
                                 "wisp rebuilt a transcript the model does not accept. (\(i.debugDescription))")
            case .timeout(let i):
                return WispError(.timeout, "Apple's model timed out. (\(i.debugDescription))")
            @unknown default:
                return WispError(.generationFailed, "Apple's model failed: \(e.localizedDescription)")
            }
        }
        if let e = error as? LanguageModelSession.Error {
            switch e {
            case .concurrentRequests:
                return WispError(.busy, "This session is already answering a request.")
            case .transcriptMutationWhileResponding:
                return WispError(.internal, "The transcript was changed while the model was answering.")
            @unknown default:
                return WispError(.generationFailed, "Apple's model failed: \(e.localizedDescription)")
            }
        }
        if let e = error as? SystemLanguageModel.Error {
            switch e {
            case .assetsUnavailable(let i):
                return WispError(.modelUnavailable,
                        "Apple's on-device model assets are not available (downloading or removed); try again in a " +
                        "few minutes. (\(i.debugDescription))")
            @unknown default:
                return WispError(.modelUnavailable,
                                 "Apple's on-device model is not available: \(e.localizedDescription)")
            }
        }
        if let e = error as? GeneratedContent.ParsingError {
            return WispError(.generationFailed,
                             "decoding failure: the model's output could not be parsed. (\(e.debugDescription))")
        }
        return nil
    }
    #endif
}
#endif
