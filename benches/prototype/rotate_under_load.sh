P="psql -h /tmp/pgque_bench -p 55515 -U postgres -d pgque_bench -X -qAt"
end=$((SECONDS+40))
while [ $SECONDS -lt $end ]; do
  $P -c "SELECT switched, truncated IS NOT NULL, evacuated, busy FROM pgque.rotate_job_log()"
  sleep 0.3
done
