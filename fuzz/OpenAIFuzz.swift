// libFuzzer target for the core's decoders of what an OpenAI-compatible server answers
// (Backends/OpenAI/OpenAIReplies.swift: /props, /v1/models, Ollama's /api/show, /tokenize,
// the input-token count, each event of a streamed chat answer) and the SSE line splitter they
// read a stream through: any bytes must decode to numbers in their ranges, or to nothing,
// never a crash or a hang. Each input is read as every kind of answer, whole and line by line
// as a stream split at an arbitrary point, and what a stream brings is added up as the
// backend adds it (saturating), over many events.
// Built and run by `make fuzz`, next to FrameFuzz.swift (seeds: fuzz/corpus-openai).
import Foundation
import WispInfrastructure

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let data = Data(bytes: start, count: count)
    let props = OpenAIReplies.props(data)
    check(props.contextSize, TokenCount.range, "/props n_ctx")
    check(props.slots, OpenAIReplies.slotCounts, "/props total_slots")
    for model in OpenAIReplies.models(data) { check(model.contextSize, TokenCount.range, "max_model_len") }
    check(OpenAIReplies.ollamaContext(data), TokenCount.range, "num_ctx")
    check(OpenAIReplies.inputTokens(data), TokenCount.range, "input_tokens")
    if let n = OpenAIReplies.tokenCount(data), n < 0 { fatalError("a negative token count \(n)") }

    // As a stream, in two pieces cut where the input's first byte says.
    var splitter = SSELineSplitter()
    let cut = count == 0 ? 0 : Int(data[data.startIndex]) % (count + 1)
    var lines = splitter.push(data.prefix(cut))
    lines += splitter.push(data.dropFirst(cut))
    lines += splitter.finish()
    var total = 0
    for line in lines + [String(decoding: data, as: UTF8.self)] {
        guard let chunk = OpenAIReplies.chunk(line) else { continue }
        let counts = [chunk.promptTokens, chunk.outputTokens, chunk.reasoningTokens, chunk.cachedTokens,
                      chunk.evaluatedTokens]
        for n in counts {
            check(n, TokenCount.range, "a usage or timings count")
            // A thread's running total over a great many such events.
            total = total.addingClamped((n ?? 0).multipliedClamped(by: 1 << 40))
        }
        for call in chunk.toolCalls { check(call.index, OpenAIReplies.toolCallIndexes, "a tool call's index") }
    }
    if total < 0 { fatalError("a saturating sum of counts went negative") }

    // The same bytes as a header's or a chunk's length.
    let text = String(decoding: data.prefix(64), as: UTF8.self)
    for radix in [10, 16] {
        if let n = OutsideNumber.int(text, radix: radix, in: 0...Int(Int32.max)), n < 0 || n > Int(Int32.max) {
            fatalError("\(text.debugDescription) read as \(n), out of its range")
        }
    }
    return 0
}

func check(_ value: Int?, _ range: ClosedRange<Int>, _ what: String) {
    if let value, !range.contains(value) { fatalError("\(what) \(value) is outside \(range)") }
}
