//! A well-formed component for some other world: it exports a `check`
//! function, but not portwise's `checker` interface. Loading it must fail
//! with a message naming what is missing.

wit_bindgen::generate!({
    inline: "
        package evil:other@0.1.0;

        interface checker {
            check: func(config: string) -> bool;
        }

        world not-a-membership-checker {
            export checker;
        }
    ",
});

struct Other;

impl exports::evil::other::checker::Guest for Other {
    fn check(_config: String) -> bool {
        true
    }
}

export!(Other);
