// The `apple` backend: Apple's on-device model through FoundationModels (macOS 26+).
//
// Every FoundationModels call in this folder was written from the SDK's module interfaces (macOS
// 26.5 SDK and Xcode 27.0 beta SDK), and `make check-apple` typechecks it against both on Linux
// (scripts/check-apple.sh, which also sets WISP_CHECK_APPLE). On a Mac the real SDK compiles it;
// on Linux it compiles to nothing. Here the backend; the conversation is `AppleSession.swift`,
// errors `AppleErrors.swift`, structured output `AppleOutputSchema.swift`, tools `AppleTool.swift`.
#if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
import Foundation
import FoundationModels
import WispInfrastructure

/// wisp's backend seam over `SystemLanguageModel`. Each wisp session owns one live
/// `LanguageModelSession`, so the model's cache carries across a thread's turns.
@available(macOS 26.0, *)
public struct AppleBackend: ModelBackend {
    public let name = "apple"
    public let model = "apple-on-device"
    private let systemModel: SystemLanguageModel

    public init(systemModel: SystemLanguageModel = .default) {
        self.systemModel = systemModel
    }

    /// True when the model can answer now: what `auto` checks before it prefers this backend.
    public static var isAvailable: Bool { SystemLanguageModel.default.isAvailable }

    public func availability() async -> Availability {
        switch systemModel.availability {
        case .available: .ready
        case .unavailable(let reason): .unavailable(Self.describe(reason))
        }
    }

    static func describe(_ reason: SystemLanguageModel.Availability.UnavailableReason) -> String {
        switch reason {
        case .deviceNotEligible:
            "Apple's on-device model cannot run on this device (Apple Intelligence needs a Mac with Apple silicon). " +
            "Use --backend openai with --endpoint instead."
        case .appleIntelligenceNotEnabled:
            "Apple Intelligence is turned off. Turn it on in System Settings > Apple Intelligence & Siri, then try " +
            "again (or use --backend openai with --endpoint)."
        case .modelNotReady:
            "Apple's on-device model is not ready: it is still downloading or being prepared. Keep the Mac online " +
            "and on power, and try again in a few minutes."
        @unknown default:
            "Apple's on-device model is not available (\(reason)). Check System Settings > Apple Intelligence & " +
            "Siri, or use --backend openai with --endpoint."
        }
    }

    /// Read at run time: 4096 on macOS 26 (below 26.4 the property itself returns 4096), 8192 on
    /// some Macs under 27, and 0 for a while after a cold start. Any positive value is the
    /// model's; only ≤ 0 (unknown) falls back to 4096, macOS 26's window.
    public func contextSize() async -> Int {
        Self.contextSize(live: systemModel.contextSize)
    }

    static func contextSize(live: Int) -> Int {
        live > 0 ? live : 4096
    }

    /// The model's own count on macOS 26.4+; nil below, or when the model cannot count now
    /// (the core then estimates and relies on the overflow report).
    public func tokenCount(_ text: String) async throws -> Int? {
        guard #available(macOS 26.4, *) else { return nil }
        do {
            return try await systemModel.tokenCount(for: text)
        } catch let error as CancellationError {
            throw error
        } catch {
            return nil
        }
    }

    /// The instructions, tools, kept turns and prompt as the transcript the session would hold,
    /// counted by the model on macOS 26.4+; nil below, or when it cannot count now.
    public func promptTokens(instructions: String?, tools: [ModelTool], history: ArraySlice<Turn>, prompt: String,
                             settings: GenerationSettings) async throws -> Int? {
        guard #available(macOS 26.4, *), let fmTools = try? AppleSession.tools(tools) else { return nil }
        let entries = AppleSession.entries(instructions: instructions, tools: fmTools,
                                           history: history) + [AppleSession.prompt(prompt)]
        do {
            return try await systemModel.tokenCount(for: entries)
        } catch let error as CancellationError {
            throw error
        } catch {
            return nil
        }
    }

    /// `reasoning` on a system whose model takes no reasoning level.
    static func noReasoningLevel() -> WispError {
        #if canImport(FoundationModels, _version: 2.0)
        let why = "this Mac runs \(ProcessInfo.processInfo.operatingSystemVersionString)"
        #else
        let why = "this wisp-core was built with an SDK before macOS 27's (build it with Xcode 27 or later)"
        #endif
        return WispError(.invalidArgument,
                "reasoning: Apple's model takes a reasoning level on macOS 27 or later only; \(why). Omit `reasoning`.")
    }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        AppleSession(model: systemModel, instructions: instructions, tools: tools, history: history)
    }
}
#endif
