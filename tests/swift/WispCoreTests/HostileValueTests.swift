// Values from outside the core that no arithmetic or encoding of theirs may trap on: a model
// server's counts and timings past any real figure, a store's file holding times JSON cannot
// write. Each is fed the way it arrives, then written into a pipe frame as the shim would get it.
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

private func frameJSON(_ message: some JSONWritable) throws -> JSONValue {
    try JSONValue.parse(Frame.encode(message).dropFirst(4))
}

@Suite struct HostileValueTests {
    @Test func aServersCountsAndTimingsPastAnyRealFigureAreReportedNotTrappedOn() throws {
        let huge = Usage(inputTokens: .max, outputTokens: .max, reasoningTokens: .max, cachedTokens: .max,
                         firstTokenSeconds: .infinity, generationSeconds: .leastNonzeroMagnitude)
        let sum = huge + huge + Usage(inputTokens: 1, outputTokens: 1, reasoningTokens: 1, cachedTokens: 1,
                                      firstTokenSeconds: .nan, generationSeconds: .greatestFiniteMagnitude)
        #expect(sum.inputTokens == .max && sum.outputTokens == .max && sum.cachedTokens == .max)
        // Int.max tokens in the least time a Double holds: a rate past Double's range.
        #expect(huge.outputTokensPerSecond == .infinity)
        for usage in [huge, sum] {
            let body = try frameJSON(UsageBody(usage))
            #expect(body["output_tokens_per_s"] == .null || body["output_tokens_per_s"]?.number?.double != nil)
            #expect(body["first_token_ms"]?.int.map { (0...1_000_000_000_000).contains($0) } == true)
            #expect(body["output_tokens"]?.int == .max)
        }
        #expect(try frameJSON(UsageBody(huge))["output_tokens_per_s"] == .null)
        let nanTimes = Usage(outputTokens: 5, firstTokenSeconds: .nan, generationSeconds: .nan)
        let body = try frameJSON(UsageBody(nanTimes))
        #expect(body["first_token_ms"]?.int == 0)
        #expect(body["output_tokens_per_s"] == nil)  // NaN is not > 0: no rate, left out
    }

    @Test func aStoresTimesThatAreNotFiniteAreListedAsNullNotTrappedOn() async throws {
        let dir = freshStateDir()
        let store = try SQLiteThreadStore(directory: dir, maxStored: 10, log: Log(level: .error))
        let lease = try await store.lease("t")
        _ = try await lease.commit(StoredThread(instructions: nil, tools: [], roots: [],
                                                history: [Turn(prompt: "p", response: "r")]),
                                   kept: 0, after: nil, usage: Usage(inputTokens: 1, outputTokens: 1))
        await lease.release()
        // SQLite reads 1e999 as infinity: a file another program wrote may hold one.
        let db = try SQLiteDatabase(path: dir + "/threads.db", create: false, maxLength: 1 << 20, busyTimeoutMs: 1000)
        try db.execute("UPDATE threads SET created_at = 1e999, updated_at = -1e999")
        let summary = try #require(await store.summaries(matching: nil, limit: 10).first)
        #expect(summary.createdAt == .infinity && summary.updatedAt == -.infinity)

        let registry = ThreadRegistry(backend: EchoBackend(), store: store)
        let page = try await registry.list()
        let info = try #require(page.threads.first { $0.thread_id == "t" })
        let shown = try frameJSON(info)
        #expect(shown["created_at"] == .null && shown["updated_at"] == .null)
        #expect(shown["turns"]?.int == 1)
    }
}
