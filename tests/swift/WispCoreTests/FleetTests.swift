import Testing
@testable import WispCore

@Suite struct FleetTests {
    @Test func weightIsStableAcrossProcesses() {
        // A fixed value (computed apart, in Python): Swift's seeded Hasher would differ from run to run.
        #expect(Rendezvous.weight(key: "t1", endpoint: "127.0.0.1:8080") == 0x6643fd3f4e18c3a2)
        #expect(Rendezvous.weight(key: "t1", endpoint: "a:1") != Rendezvous.weight(key: "t1", endpoint: "a:2"))
    }

    @Test func boundIsCeilingOfAQuarterOver() {
        #expect(Rendezvous.bound(live: 32, healthy: 3) == 14)
        #expect(Rendezvous.bound(live: 1, healthy: 3) == 1)
        #expect(Rendezvous.bound(live: 4, healthy: 2) == 3)
        #expect(Rendezvous.bound(live: 5, healthy: 0) == 0)
        #expect(Rendezvous.bound(live: Int.max, healthy: 1) > 0)  // no trap on a huge count
    }

    @Test func placementHoldsTheBoundOver32Threads() {
        let names = ["a:1", "b:1", "c:1"]
        var loads = [0, 0, 0]
        for t in 0..<32 {
            let pick = Rendezvous.place(key: "thread-\(t)", candidates: [0, 1, 2], names: names, loads: loads,
                                        live: t + 1)!
            loads[pick] += 1
            #expect(loads.max()! <= Rendezvous.bound(live: t + 1, healthy: 3))
        }
        #expect(Double(loads.max()!) / Double(loads.min()!) <= 1.5)
    }

    @Test func anEndpointTakesTurnsOnlyOnceJudgedUpAndBacksOffTo60Seconds() {
        var h = EndpointHealth()
        let t0 = ContinuousClock.now
        #expect(!h.usable && h.nextCheck(at: t0) == t0)  // never judged: checked at once, takes nothing meanwhile
        h.answered()
        #expect(h.usable && h.nextCheck(at: t0) == nil)
        h.failed("refused", at: t0)
        #expect(!h.usable && h.nextCheck(at: t0) == t0 + .seconds(5))
        h.failed("refused", at: t0)
        #expect(h.nextCheck(at: t0) == t0 + .seconds(10))
        for _ in 0..<100 { h.failed("refused", at: t0) }  // no overflow however long it stays down
        #expect(h.down?.pause == .seconds(60) && h.nextCheck(at: t0) == t0 + .seconds(60))
        h.recheck = Task {}
        #expect(h.nextCheck(at: t0) == nil)  // its timer is set: not twice
        h.answered()
        #expect(h.usable && h.recheck == nil)
        h.leftOut = "it does not serve --model"
        h.up = false
        #expect(!h.usable && h.nextCheck(at: t0 + .seconds(600)) == nil)
    }

    @Test func aPinFollowsItsThreadAndIsFreedWithIt() {
        let pins = FleetPins(names: ["a:1", "b:1"])
        var thread: SessionAffinity? = SessionAffinity(key: "x")
        let first = pins.endpoint(for: thread!, usable: [true, true])!
        #expect(pins.endpoint(for: thread!, usable: [true, true]) == first)
        var moved = [true, true]
        moved[first] = false
        let other = pins.endpoint(for: thread!, usable: moved)!
        #expect(other != first)
        #expect(pins.endpoint(for: thread!, usable: [true, true]) == other)  // back, but it stays
        thread = nil
        #expect(pins.loads == [0, 0])
    }

    @Test func aForkStartsOnItsSourcesEndpointWhileTheBoundAllows() {
        let names = ["a:1", "b:1"]
        let pins = FleetPins(names: names)
        let source = SessionAffinity(key: "source")
        let home = pins.endpoint(for: source, usable: [true, true])!
        // Fork ids the hash alone would send elsewhere: the source's pin must win.
        let away = (0..<64).map { "fork-\($0)" }.filter {
            Rendezvous.order(key: $0, candidates: [0, 1], names: names).first != home
        }
        #expect(away.count >= 2)
        let fork = SessionAffinity(key: away[0], source: source)
        #expect(pins.endpoint(for: fork, usable: [true, true]) == home)
        #expect(fork.takeSource() == nil)  // asked once, at the first pin
        // Two pins there and three live: the bound (ceil(1.25 × 3 ÷ 2) = 2) sends the next fork by the hash.
        let full = SessionAffinity(key: away[1], source: source)
        #expect(pins.endpoint(for: full, usable: [true, true]) != home)
        withExtendedLifetime((source, fork, full)) {}
    }
}
