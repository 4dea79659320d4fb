from speechctl.cli import main

main()
