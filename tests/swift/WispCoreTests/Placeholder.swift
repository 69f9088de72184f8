import Testing
@testable import WispCore
@Test func placeholder() { #expect(estimatedTokens("abcde") == 2) }
