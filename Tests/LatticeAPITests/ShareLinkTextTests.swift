import LatticeAPI
import LatticeCore
import Testing

/// Share links as people paste them (issue 30): punctuation after a link, short links, and the typed
/// invitations answer.
struct ShareLinkTextTests {
    @Test(arguments: [".", ",", ")", "]", "}", ">", "!", "?", "'", "\"", ";", ":", "*", ").", "\"!", "%22", "%29", "%3e", "%5D"])
    func punctuationAfterALinkIsDropped(_ tail: String) {
        #expect(ShareLinksRequest.token(fromLink: "https://h.example/share/eyJa.eyJb.c2ln" + tail) == "eyJa.eyJb.c2ln")
        #expect(ShareLinksRequest.token(fromLink: "eyJa.eyJb.c2ln" + tail) == "eyJa.eyJb.c2ln")
        #expect(ShareLinkText.shortCode(fromLink: "https://h.example/s/k7m2p9x4qa" + tail) == "k7m2p9x4qa")
    }

    @Test func blanksAndBase64URLAreKept() {
        #expect(ShareLinkText.withoutTrailingPunctuation("eyJa.eyJb.c2ln-_") == "eyJa.eyJb.c2ln-_")
        #expect(ShareLinkText.withoutTrailingPunctuation("eyJa.eyJb.c2ln\n") == "eyJa.eyJb.c2ln\n", "a padded token stays dead")
        #expect(ShareLinkText.withoutTrailingPunctuation("...") == "")
    }

    @Test func shortCodesAreTenCharactersWithoutLookAlikes() {
        #expect(ShortLinkCode.alphabet.count == 31 && !ShortLinkCode.alphabet.contains { "01ilo".contains($0) })
        #expect(ShortLinkCode.normalized("K7M2P9X4QA") == "k7m2p9x4qa", "capitals read as small letters")
        for bad in ["k7m2p9x4q", "k7m2p9x4qaa", "k7m2p9x4q0", "k7m2p9x4ql", "k7m2p9x4q-", "", "ｋ7m2p9x4qa"] {
            #expect(ShortLinkCode.normalized(bad) == nil, "\(bad)")
        }
        #expect(ShareLinkText.shortCode(fromLink: "https://h.example/s/k7m2p9x4qa/") == "k7m2p9x4qa")
        #expect(ShareLinkText.shortCode(fromLink: "https://h.example/share/eyJa.eyJb.c2ln") == nil)
        #expect(ShareLinkText.shortCode(fromLink: "https://h.example/s/k7m2p9x4qa/extra") == nil)
    }

    @Test func invitationsRoundTrip() throws {
        let invitation = ShareInvitation(zoneID: WireZoneID(zoneName: "Trips", ownerRecordName: "_ann"), shareRecordName: "cloudkit.zoneshare",
                                         title: "Lisbon", ownerName: "ann", permission: .readWrite, url: "https://h.example/share/t")
        let answer = ShareInvitationsResponse(invitations: [invitation])
        #expect(ShareInvitationsResponse(json: answer.json) == answer)
        let item = try #require(answer.json["invitations"]?.arrayValue?.first?.objectValue)
        #expect(Set(item.keys) == ["zoneID", "shareRecordName", "title", "ownerName", "permission", "url"])
        #expect(invitation.target.json == .object(["zoneID": .object(["zoneName": .string("Trips"), "ownerRecordName": .string("_ann")]),
                                                   "shareRecordName": .string("cloudkit.zoneshare")]))
        #expect(throws: ServiceError.self) { try ShareInvitationsRequest(json: .array([])) }
        let url = ShareURLResponse(url: "u", shortURL: "https://h.example/s/k7m2p9x4qa", token: "t", permission: .readOnly, epoch: 1)
        #expect(ShareURLResponse(json: url.json) == url)
    }
}
