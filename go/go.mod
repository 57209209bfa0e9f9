module kvlib

go 1.22
