import WispInfrastructure

/// What the shim must know of the core before the core runs, stated here once, as data, from
/// the declarations the core itself works by: `wisp-core --facts` prints it, `make facts` keeps
/// the shim's copy (python/wisp_shim/core_facts.json), and tests/python/test_agreement.py checks
/// that copy against the built core. The shim trusts it and declares none of these itself.
public enum CoreFacts {
    public static var json: JSONValue {
        [
            "protocol": .number(JSONNumber(protocolVersion)),
            "max_frame_bytes": .number(JSONNumber(maxFrameBytes)),
            "max_output_tokens": .number(JSONNumber(Respond.maxOutputTokens.upperBound)),
            "error_codes": .array(WispError.Code.allCases.map { .string($0.rawValue) }),
            "backends": .array(BackendKind.allCases.map { .string($0.rawValue) }),
            // The `op` of every request the pipe reads, in the order the core declares them.
            "operations": .array(PipeOperations.names.map { .string($0) }),
            "flags": .object(CoreConfig.ranges.map { flag, range in
                var facts: [JSONMember] = [
                    JSONMember("minimum", .number(JSONNumber(range.lowerBound))),
                    JSONMember("maximum", .number(JSONNumber(range.upperBound))),
                ]
                if let given = defaults[flag] { facts.append(JSONMember("default", .number(JSONNumber(given)))) }
                return JSONMember("--" + flag, .object(facts))
            }),
            "thread_id": [
                "bytes": .string(regexClass(ThreadRegistry.idBytes)),
                "max_length": .number(JSONNumber(ThreadRegistry.maxIDLength)),
                "rule": .string(ThreadRegistry.idRule),
            ],
            "client_roots": ["max": .number(JSONNumber(ThreadRegistry.maxRoots))],
            "query": ["max_bytes": .number(JSONNumber(ThreadQuery.maxBytes))],
            "progress": [
                "preview_code_points": .number(JSONNumber(ProgressFrames.previewCodePoints)),
                "interval_ms": .number(JSONNumber(ProgressFrames.intervalMs)),
            ],
            "reasoning_levels": .array(ReasoningLevel.allCases.map { .string($0.rawValue) }),
            "model_tools": .array(ToolCatalogue.tools(roots: Roots([])).map { tool in
                ["name": .string(tool.name), "description": .string(tool.description)]
            }),
        ]
    }

    /// The integer flags with a default of their own.
    private static let defaults = [
        "max-threads": CoreConfig.defaultMaxThreads, "max-queue": CoreConfig.defaultMaxQueue,
        "max-stored-threads": CoreConfig.defaultMaxStoredThreads,
    ]

    /// Byte ranges as a regex character class's inside (`A-Za-z._\-`): ASCII only.
    static func regexClass(_ ranges: [ClosedRange<UInt8>]) -> String {
        func one(_ b: UInt8) -> String {
            let c = String(UnicodeScalar(b))
            return "\\^-[]".utf8.contains(b) ? "\\" + c : c
        }
        return ranges.map { r in r.count == 1 ? one(r.lowerBound) : one(r.lowerBound) + "-" + one(r.upperBound) }
            .joined()
    }
}
