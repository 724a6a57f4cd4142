fn main() {
    println!("portwise");
}
